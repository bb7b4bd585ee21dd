package main

// The `floor` command: the fewest vSphere calls a client needs for the lifecycle
// banlieue gives a machine (clone from the template with its guestinfo, power on,
// wait for a guest address, power off, destroy), for n machines at once, on one
// session. The backend benchmark (`backend-floor-bench`) reports banlieue's calls,
// sessions and times as ratios to these.
//
// What makes it the floor: the clone carries the configuration (CPUs, memory,
// guestinfo) and PowerOn, so one call creates a running, configured machine; every
// wait is one property filter over a container view of the VM folder, not a filter
// per task; lookups of the template, pool, datastore and folder happen once.

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/view"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

const floorPrefix = "floor-"

func (h *harness) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for k, v := range h.calls {
		out[k] = v
	}
	return out
}

func diff(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// floor runs the lifecycle for n machines and reports the calls of each phase (by
// method) and the seconds from the first call to all addressed and to all gone.
func floor(ctx context.Context, h *harness, u *url.URL, template string, n int) (map[string]any, error) {
	if n <= 0 {
		return nil, fmt.Errorf("floor: n must be positive")
	}
	before := h.snapshot()
	started := time.Now()
	c, err := govmomi.NewClient(ctx, u, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Logout(context.Background()) }()
	finder := find.NewFinder(c.Client, true)
	dc, err := finder.Datacenter(ctx, "DC0")
	if err != nil {
		return nil, err
	}
	finder.SetDatacenter(dc)
	tmpl, err := finder.VirtualMachine(ctx, template)
	if err != nil {
		return nil, err
	}
	var t mo.VirtualMachine
	if err := tmpl.Properties(ctx, tmpl.Reference(), []string{"snapshot.currentSnapshot"}, &t); err != nil {
		return nil, err
	}
	if t.Snapshot == nil || t.Snapshot.CurrentSnapshot == nil {
		return nil, fmt.Errorf("floor: template %s has no snapshot", template)
	}
	pool, err := finder.ResourcePool(ctx, "/DC0/host/DC0_C0/Resources")
	if err != nil {
		return nil, err
	}
	ds, err := finder.Datastore(ctx, "LocalDS_0")
	if err != nil {
		return nil, err
	}
	folders, err := dc.Folders(ctx)
	if err != nil {
		return nil, err
	}
	vms, err := view.NewManager(c.Client).CreateContainerView(ctx, folders.VmFolder.Reference(), []string{"VirtualMachine"}, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = vms.Destroy(context.Background()) }()

	userData := base64.StdEncoding.EncodeToString([]byte("#cloud-config\nruncmd: [echo banlieue]\n"))
	poolRef, dsRef, snap := pool.Reference(), ds.Reference(), *t.Snapshot.CurrentSnapshot
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("%s%d", floorPrefix, i)
			metaData := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", name, name)))
			spec := types.VirtualMachineCloneSpec{
				Location: types.VirtualMachineRelocateSpec{
					Pool:         &poolRef,
					Datastore:    &dsRef,
					DiskMoveType: string(types.VirtualMachineRelocateDiskMoveOptionsCreateNewChildDiskBacking),
				},
				Snapshot: &snap,
				PowerOn:  true,
				Config: &types.VirtualMachineConfigSpec{
					NumCPUs:  2,
					MemoryMB: 1024,
					ExtraConfig: []types.BaseOptionValue{
						&types.OptionValue{Key: "guestinfo.userdata", Value: userData},
						&types.OptionValue{Key: "guestinfo.userdata.encoding", Value: "base64"},
						&types.OptionValue{Key: "guestinfo.metadata", Value: metaData},
						&types.OptionValue{Key: "guestinfo.metadata.encoding", Value: "base64"},
					},
				},
			}
			if _, err := tmpl.Clone(ctx, folders.VmFolder, name, spec); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}

	// Every clone running with a guest address.
	// A modify update carries only what changed: names come with the enter update.
	addressed := map[types.ManagedObjectReference]bool{}
	ours := map[types.ManagedObjectReference]bool{}
	if err := watchVMs(ctx, c, vms, []string{"name", "guest.ipAddress"}, func(ref types.ManagedObjectReference, props map[string]any, gone bool) bool {
		if name, ok := props["name"].(string); ok {
			ours[ref] = strings.HasPrefix(name, floorPrefix)
		}
		if ip, _ := props["guest.ipAddress"].(string); ip != "" && ours[ref] {
			addressed[ref] = true
		}
		return len(addressed) == n
	}); err != nil {
		return nil, err
	}
	ready := time.Since(started)
	readyCalls := diff(h.snapshot(), before)

	// Power off, then destroy once off (a running VM cannot be destroyed).
	deleting := time.Now()
	beforeDelete := h.snapshot()
	for ref := range addressed {
		if _, err := object.NewVirtualMachine(c.Client, ref).PowerOff(ctx); err != nil {
			return nil, err
		}
	}
	off := map[types.ManagedObjectReference]bool{}
	destroyed := 0
	var failed error
	if err := watchVMs(ctx, c, vms, []string{"runtime.powerState"}, func(ref types.ManagedObjectReference, props map[string]any, gone bool) bool {
		if !addressed[ref] {
			return false
		}
		if gone {
			destroyed++
			return destroyed == n
		}
		if state, ok := props["runtime.powerState"].(types.VirtualMachinePowerState); ok && state == types.VirtualMachinePowerStatePoweredOff && !off[ref] {
			off[ref] = true
			if _, err := object.NewVirtualMachine(c.Client, ref).Destroy(ctx); err != nil {
				failed = fmt.Errorf("destroy %s: %w", ref, err)
				return true
			}
		}
		return false
	}); err != nil {
		return nil, err
	}
	if failed != nil {
		return nil, failed
	}
	gone := time.Since(deleting)
	goneCalls := diff(h.snapshot(), beforeDelete)
	return map[string]any{
		"readySeconds": ready.Seconds(),
		"goneSeconds":  gone.Seconds(),
		"readyCalls":   readyCalls,
		"goneCalls":    goneCalls,
	}, nil
}

// watchVMs calls f with each update of the view's VMs (their changed properties, or
// gone) until f returns true: one filter, one WaitForUpdatesEx per batch of changes.
func watchVMs(ctx context.Context, c *govmomi.Client, v *view.ContainerView, props []string, f func(types.ManagedObjectReference, map[string]any, bool) bool) error {
	filter := new(property.WaitFilter)
	filter.Spec.ObjectSet = []types.ObjectSpec{{
		Obj:  v.Reference(),
		Skip: types.NewBool(true),
		SelectSet: []types.BaseSelectionSpec{&types.TraversalSpec{
			Type: "ContainerView",
			Path: "view",
		}},
	}}
	filter.Spec.PropSet = []types.PropertySpec{{Type: "VirtualMachine", PathSet: props}}
	return property.WaitForUpdatesEx(ctx, property.DefaultCollector(c.Client), filter, func(updates []types.ObjectUpdate) bool {
		done := false
		for _, u := range updates {
			values := map[string]any{}
			for _, change := range u.ChangeSet {
				values[change.Name] = change.Val
			}
			if f(u.Obj, values, u.Kind == types.ObjectUpdateKindLeave) {
				done = true
			}
		}
		return done
	})
}
