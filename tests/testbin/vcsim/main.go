// Command vcsim runs govmomi's vCenter simulator for banlieue's vSphere tests.
//
// Started by tests/integration/src/vcsim.rs as a child process (built by build.sh):
//
//	vcsim [-clusters 2] [-ip-prefix 10.77] [-listen 127.0.0.1:0]
//
// It serves the vSphere Web Services API (SOAP, /sdk) on https://127.0.0.1:<port>
// (loopback; -listen names another address, e.g. a test rig's node IP inside the
// rig's network namespace) with a certificate for that address signed by a CA it
// makes up, seeds a template VM
// with a snapshot (for linked clones), and prints ONE JSON line on stdout when ready:
//
//	{"endpoint": "https://127.0.0.1:PORT", "caPem": "...", "username": "...",
//	 "password": "...", "template": "/DC0/vm/ubuntu-2404", "datacenter": "DC0",
//	 "clusters": ["DC0_C0", "DC0_C1"], "version": "..."}
//
// Then it reads one JSON command per line on stdin and answers one JSON line on stdout
// ({"ok": true, ...} or {"ok": false, "error": "..."}). Commands ("cmd"):
//
//	vms                              every VM: name, moref, biosUUID, instanceUUID, power, template, cpus, memoryMB, extraConfig, firmware, secureBoot, ip, pool, nics, diskKB (the first disk), disksKB, diskFiles (each disk's backing file), diskPaths (where each is on this host)
//	sessions                         the vCenter sessions (the harness's own left out)
//	terminate_sessions               end every session (as an expiry would)
//	fail_task {method, message, times}   the next calls of a *_Task method start a task that fails with message
//	fail {method, message, times}    answer calls of a method with a SOAP fault (SystemError)
//	clear_faults                     forget injected faults
//	task_delay {ms}                  every task waits ms milliseconds before it runs
//	calls                            how often each method was called, by name (the harness's own calls included)
//	floor {n}                        the fewest calls for banlieue's lifecycle on n machines at once, on one new session (floor.go): calls and seconds to all addressed, then to all gone
//
// Powered-on VMs get a guest IP (as VMware Tools would report) after a short while:
// <ip-prefix>.<n / 256>.<n % 256>. EOF on stdin stops the server.
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

const templateName = "ubuntu-2404"

// certs makes a CA and a server certificate for 127.0.0.1 and ip signed by it: rustls
// (webpki) refuses a self-signed CA certificate used as the server's own.
func certs(ip net.IP) (tls.Certificate, string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "banlieue vcsim CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), ip},
		DNSNames:     []string{"localhost"},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	return tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key}, caPEM, nil
}

func secret() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// taskFault is a fault a VM task will end with.
type taskFault struct {
	message string
	times   int
}

// harness holds the injected faults; Registry.Handler consults it on every call.
type harness struct {
	mu     sync.Mutex
	tasks  map[string]*taskFault
	faults map[string]*taskFault
	armed  []armed
	calls  map[string]int
	// Where the floor client logs in (the server's URL with the credentials), and the template it clones.
	url      *url.URL
	template string
}

// armed is a task failure waiting for the next task on an object.
type armed struct {
	entity  types.ManagedObjectReference
	message string
}

// Reference makes the harness a Registry handler (RegisterObject); the value is
// only its key among the handlers.
func (h *harness) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "BanlieueHarness", Value: "harness"}
}

// PutObject sees every new object; a task on an armed entity gets a runner that
// fails with the armed message. Task.Run puts the task before it starts the runner,
// in the caller's goroutine, so the swap always wins.
func (h *harness) PutObject(_ *simulator.Context, obj mo.Reference) {
	task, ok := obj.(*simulator.Task)
	if !ok || task.Info.Entity == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, a := range h.armed {
		if a.entity != *task.Info.Entity {
			continue
		}
		h.armed = append(h.armed[:i], h.armed[i+1:]...)
		msg := a.message
		task.Execute = func(*simulator.Task) (types.AnyType, types.BaseMethodFault) {
			return nil, &types.SystemError{RuntimeFault: types.RuntimeFault{MethodFault: types.MethodFault{
				FaultMessage: []types.LocalizableMessage{{Key: "banlieue.injected", Message: msg}},
			}}, Reason: msg}
		}
		return
	}
}

// UpdateObject is part of RegisterObject; nothing to do.
func (h *harness) UpdateObject(*simulator.Context, mo.Reference, []types.PropertyChange) {}

// RemoveObject is part of RegisterObject; nothing to do.
func (h *harness) RemoveObject(*simulator.Context, types.ManagedObjectReference) {}

func take(m map[string]*taskFault, method string) (string, bool) {
	f, ok := m[method]
	if !ok {
		return "", false
	}
	f.times--
	if f.times <= 0 {
		delete(m, method)
	}
	return f.message, true
}

func (h *harness) handle(_ *simulator.Context, method *simulator.Method) (mo.Reference, types.BaseMethodFault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls[method.Name]++
	if msg, ok := take(h.faults, method.Name); ok {
		return nil, &types.SystemError{Reason: msg}
	}
	if msg, ok := take(h.tasks, method.Name); ok {
		h.armed = append(h.armed, armed{entity: method.This, message: msg})
	}
	return nil, nil
}

func main() {
	clusters := flag.Int("clusters", 2, "compute clusters in the datacenter")
	ipPrefix := flag.String("ip-prefix", "10.77", "first two octets of the guest IPs")
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on (port 0: any free port)")
	flag.Parse()
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || net.ParseIP(host) == nil {
		log.Fatalf("-listen %q: want IP:PORT", *listen)
	}
	log.SetOutput(os.Stderr)
	log.SetPrefix("vcsim: ")

	cert, caPEM, err := certs(net.ParseIP(host))
	if err != nil {
		log.Fatal(err)
	}
	user, pass := "banlieue@vsphere.local", secret()

	model := simulator.VPX()
	model.Datacenter = 1
	model.Cluster = *clusters
	model.ClusterHost = 1
	model.Host = 0
	model.Datastore = 2
	model.Machine = 1
	model.Portgroup = 1
	model.Autostart = false
	if err := model.Create(); err != nil {
		log.Fatal(err)
	}
	model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	model.Service.Listen = &url.URL{Host: *listen, User: url.UserPassword(user, pass)}
	h := &harness{tasks: map[string]*taskFault{}, faults: map[string]*taskFault{}, calls: map[string]int{}}
	model.Map().Handler = h.handle
	model.Map().AddHandler(h)
	server := model.Service.NewServer()
	defer server.Close()

	ctx := context.Background()
	u := *server.URL
	client, err := govmomi.NewClient(ctx, &u, true)
	if err != nil {
		log.Fatal(err)
	}
	template, err := seed(ctx, client)
	if err != nil {
		log.Fatal(err)
	}
	h.url, h.template = &u, template

	go guestIPs(model, *ipPrefix)

	names := []string{}
	for i := 0; i < *clusters; i++ {
		names = append(names, fmt.Sprintf("DC0_C%d", i))
	}
	ready := map[string]any{
		"endpoint":   fmt.Sprintf("https://%s", server.URL.Host),
		"caPem":      caPEM,
		"username":   user,
		"password":   pass,
		"template":   template,
		"datacenter": "DC0",
		"clusters":   names,
		"version":    client.ServiceContent.About.FullName,
	}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(ready)

	var current types.UserSession
	var sm mo.SessionManager
	pc := property.DefaultCollector(client.Client)
	if err := pc.RetrieveOne(ctx, *client.ServiceContent.SessionManager, []string{"currentSession"}, &sm); err == nil && sm.CurrentSession != nil {
		current = *sm.CurrentSession
	}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		answer, err := command(ctx, client, h, current.Key, line)
		if err != nil {
			answer = map[string]any{"ok": false, "error": err.Error()}
		} else {
			answer["ok"] = true
		}
		_ = out.Encode(answer)
	}
}

// seed turns the first cluster's VM into the template ubuntu-2404 with a snapshot
// "base" (for linked clones) in the datacenter's VM folder.
func seed(ctx context.Context, c *govmomi.Client) (string, error) {
	finder := find.NewFinder(c.Client, true)
	dc, err := finder.Datacenter(ctx, "DC0")
	if err != nil {
		return "", err
	}
	finder.SetDatacenter(dc)
	vm, err := finder.VirtualMachine(ctx, "DC0_C0_RP0_VM0")
	if err != nil {
		return "", err
	}
	task, err := vm.Rename(ctx, templateName)
	if err == nil {
		err = task.Wait(ctx)
	}
	if err != nil {
		return "", err
	}
	if task, err = vm.CreateSnapshot(ctx, "base", "for linked clones", false, false); err == nil {
		err = task.Wait(ctx)
	}
	if err != nil {
		return "", err
	}
	if err := vm.MarkAsTemplate(ctx); err != nil {
		return "", err
	}
	return "/DC0/vm/" + templateName, nil
}

// guestIPs plays VMware Tools: a powered-on VM without a guest IP gets one.
func guestIPs(model *simulator.Model, prefix string) {
	ctx := model.Service.Context
	n := 10
	for {
		time.Sleep(100 * time.Millisecond)
		for _, ref := range model.Map().AllReference("VirtualMachine") {
			vm, ok := ref.(*simulator.VirtualMachine)
			if !ok {
				continue
			}
			ctx.Map.WithLock(ctx, vm, func() {
				if vm.Config == nil || vm.Config.Template || vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn || vm.Guest.IpAddress != "" {
					return
				}
				ip := fmt.Sprintf("%s.%d.%d", prefix, n/256%256, n%256)
				n++
				changes := []types.PropertyChange{
					{Name: "guest.ipAddress", Val: ip},
					{Name: "summary.guest.ipAddress", Val: ip},
					{Name: "guest.toolsRunningStatus", Val: string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)},
				}
				if len(vm.Guest.Net) > 0 {
					vm.Guest.Net[0].IpAddress = []string{ip}
					changes = append(changes, types.PropertyChange{Name: "guest.net", Val: vm.Guest.Net})
				}
				ctx.Map.Update(ctx, vm, changes)
			})
		}
	}
}

type request struct {
	Cmd     string `json:"cmd"`
	Method  string `json:"method"`
	Message string `json:"message"`
	Times   int    `json:"times"`
	Ms      int    `json:"ms"`
	N       int    `json:"n"`
}

func command(ctx context.Context, c *govmomi.Client, h *harness, own, line string) (map[string]any, error) {
	var r request
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return nil, err
	}
	if r.Times <= 0 {
		r.Times = 1
	}
	if r.Message == "" {
		r.Message = "injected failure"
	}
	switch r.Cmd {
	case "vms":
		vms, err := listVMs(ctx, c)
		return map[string]any{"vms": vms}, err
	case "sessions":
		var sm mo.SessionManager
		err := property.DefaultCollector(c.Client).RetrieveOne(ctx, *c.ServiceContent.SessionManager, []string{"sessionList"}, &sm)
		out := []map[string]any{}
		for _, s := range sm.SessionList {
			if s.Key != own {
				out = append(out, map[string]any{"key": s.Key, "userName": s.UserName})
			}
		}
		return map[string]any{"sessions": out}, err
	case "terminate_sessions":
		var sm mo.SessionManager
		if err := property.DefaultCollector(c.Client).RetrieveOne(ctx, *c.ServiceContent.SessionManager, []string{"sessionList"}, &sm); err != nil {
			return nil, err
		}
		keys := []string{}
		for _, s := range sm.SessionList {
			if s.Key != own {
				keys = append(keys, s.Key)
			}
		}
		if len(keys) > 0 {
			if err := c.SessionManager.TerminateSession(ctx, keys); err != nil {
				return nil, err
			}
		}
		return map[string]any{"terminated": len(keys)}, nil
	case "fail_task":
		h.mu.Lock()
		h.tasks[r.Method] = &taskFault{message: r.Message, times: r.Times}
		h.mu.Unlock()
		return map[string]any{}, nil
	case "fail":
		h.mu.Lock()
		h.faults[r.Method] = &taskFault{message: r.Message, times: r.Times}
		h.mu.Unlock()
		return map[string]any{}, nil
	case "calls":
		h.mu.Lock()
		counts := map[string]int{}
		for k, v := range h.calls {
			counts[k] = v
		}
		h.mu.Unlock()
		return map[string]any{"calls": counts}, nil
	case "task_delay":
		// Every task waits this long before it runs (a slow vCenter; clones in flight).
		simulator.TaskDelay.Delay = r.Ms
		return map[string]any{}, nil
	case "floor":
		return floor(ctx, h, h.url, h.template, r.N)
	case "clear_faults":
		h.mu.Lock()
		h.tasks = map[string]*taskFault{}
		h.faults = map[string]*taskFault{}
		h.armed = nil
		h.mu.Unlock()
		return map[string]any{}, nil
	}
	return nil, fmt.Errorf("unknown command %q", r.Cmd)
}

func listVMs(ctx context.Context, c *govmomi.Client) ([]map[string]any, error) {
	v, err := allVMs(ctx, c)
	if err != nil {
		return nil, err
	}
	dirs, err := datastoreDirs(ctx, c)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, vm := range v {
		extra := map[string]string{}
		cpus, mem, template, uuid, instanceUUID := int32(0), int32(0), false, "", ""
		firmware, secureBoot := "", false
		if vm.Config != nil {
			instanceUUID = vm.Config.InstanceUuid
			firmware = vm.Config.Firmware
			if b := vm.Config.BootOptions; b != nil && b.EfiSecureBootEnabled != nil {
				secureBoot = *b.EfiSecureBootEnabled
			}
			for _, o := range vm.Config.ExtraConfig {
				ov := o.GetOptionValue()
				extra[ov.Key] = fmt.Sprint(ov.Value)
			}
			cpus, mem, template, uuid = vm.Config.Hardware.NumCPU, vm.Config.Hardware.MemoryMB, vm.Config.Template, vm.Config.Uuid
		}
		nics := []map[string]string{}
		diskKB := int64(0)
		disksKB := []int64{}
		diskFiles := []string{}
		diskPaths := []string{}
		if vm.Config != nil {
			for _, d := range vm.Config.Hardware.Device {
				if disk, ok := d.(*types.VirtualDisk); ok {
					if diskKB == 0 {
						diskKB = disk.CapacityInKB
					}
					disksKB = append(disksKB, disk.CapacityInKB)
					file := ""
					if b, ok := disk.Backing.(types.BaseVirtualDeviceFileBackingInfo); ok {
						file = b.GetVirtualDeviceFileBackingInfo().FileName
					}
					diskFiles = append(diskFiles, file)
					diskPaths = append(diskPaths, hostPath(dirs, file))
				}
				card, ok := d.(types.BaseVirtualEthernetCard)
				if !ok {
					continue
				}
				nic := map[string]string{"mac": card.GetVirtualEthernetCard().MacAddress}
				switch b := card.GetVirtualEthernetCard().Backing.(type) {
				case *types.VirtualEthernetCardNetworkBackingInfo:
					nic["network"] = b.DeviceName
				case *types.VirtualEthernetCardDistributedVirtualPortBackingInfo:
					nic["portgroupKey"] = b.Port.PortgroupKey
				}
				nics = append(nics, nic)
			}
		}
		ip := ""
		if vm.Guest != nil {
			ip = vm.Guest.IpAddress
		}
		pool := ""
		if vm.ResourcePool != nil {
			pool = vm.ResourcePool.Value
		}
		out = append(out, map[string]any{
			"name": vm.Name, "moref": vm.Self.Value, "biosUUID": uuid, "instanceUUID": instanceUUID, "power": string(vm.Runtime.PowerState),
			"template": template, "cpus": cpus, "memoryMB": mem, "extraConfig": extra, "firmware": firmware, "secureBoot": secureBoot,
			"ip": ip, "pool": pool, "nics": nics, "diskKB": diskKB, "disksKB": disksKB, "diskFiles": diskFiles, "diskPaths": diskPaths,
		})
	}
	return out, nil
}

// allVMs reads the properties "vms" reports of every VM in the inventory.
func allVMs(ctx context.Context, c *govmomi.Client) ([]mo.VirtualMachine, error) {
	finder := find.NewFinder(c.Client, false)
	all, err := finder.VirtualMachineList(ctx, "/...")
	if err != nil {
		if _, ok := err.(*find.NotFoundError); ok {
			return nil, nil
		}
		return nil, err
	}
	refs := make([]types.ManagedObjectReference, 0, len(all))
	for _, vm := range all {
		refs = append(refs, vm.Reference())
	}
	var vms []mo.VirtualMachine
	if len(refs) == 0 {
		return vms, nil
	}
	err = property.DefaultCollector(c.Client).Retrieve(ctx, refs, []string{"name", "config", "runtime.powerState", "guest.ipAddress", "resourcePool"}, &vms)
	return vms, err
}

// datastoreDirs maps each datastore's name to the host directory vcsim keeps it in.
func datastoreDirs(ctx context.Context, c *govmomi.Client) (map[string]string, error) {
	finder := find.NewFinder(c.Client, false)
	all, err := finder.DatastoreList(ctx, "/...")
	if err != nil {
		if _, ok := err.(*find.NotFoundError); ok {
			return map[string]string{}, nil
		}
		return nil, err
	}
	refs := make([]types.ManagedObjectReference, 0, len(all))
	for _, ds := range all {
		refs = append(refs, ds.Reference())
	}
	var stores []mo.Datastore
	if err := property.DefaultCollector(c.Client).Retrieve(ctx, refs, []string{"name", "summary"}, &stores); err != nil {
		return nil, err
	}
	dirs := map[string]string{}
	for _, ds := range stores {
		dirs[ds.Name] = ds.Summary.Url
	}
	return dirs, nil
}

// hostPath turns "[ds] dir/file.vmdk" into the file's path on this host ("" when the
// datastore is unknown).
func hostPath(dirs map[string]string, file string) string {
	var p object.DatastorePath
	if !p.FromString(file) {
		return ""
	}
	dir, ok := dirs[p.Datastore]
	if !ok {
		return ""
	}
	return filepath.Join(dir, filepath.FromSlash(p.Path))
}
