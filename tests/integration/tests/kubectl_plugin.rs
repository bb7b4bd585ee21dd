//! The `kubectl-banlieue` plugin binary against a real apiserver and banlieue's
//! controllers (simulated backend): `get` lists the VMs with why each is (not) Ready,
//! and `describe` names the broken link of each broken VM — a missing class, a
//! Provider whose credentials Secret is missing, a backend that refuses the machine.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_sdk::api::infra::MachineAddressType;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::conditions;
use kube::api::Api;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// The plugin binary, built once per test process.
fn plugin() -> PathBuf {
    banlieue_testenv::workspace_binary("kubectl-banlieue", "kubectl-banlieue")
}

/// Runs the plugin as kubectl would (its own process, the kubeconfig from the
/// environment).
async fn kubectl_banlieue(args: &[&str]) -> Output {
    let kubeconfig = banlieue_testenv::kubeconfig_path().to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(plugin())
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .output()
            .expect("run kubectl-banlieue")
    })
    .await
    .expect("join")
}

async fn stdout_of(args: &[&str]) -> String {
    let output = kubectl_banlieue(args).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        output.status.success(),
        "kubectl-banlieue {args:?} failed: {stderr}\n{stdout}"
    );
    stdout
}

fn vm(name: &str, class: &str, image: &str, provider: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                 "networks": [{"name": "eth0", "networkClass": "lan"}],
                 "placement": {"providerRef": {"name": provider}}}
    })
}

fn reason(vm: &VirtualMachine, type_: &str) -> Option<String> {
    vm.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, type_))
        .map(|c| c.reason.clone())
}

/// The table row of `name` (its cells), from `get`'s output.
fn row<'a>(table: &'a str, name: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_describe_explain_ready_and_broken_virtual_machines() {
    // Build first: a cold build must not eat into the controllers' wait budget.
    tokio::task::spawn_blocking(plugin).await.expect("build");
    let ns = banlieue_testenv::namespace("kubectl").await;
    let (class, image) = (format!("{}-small", ns.name), format!("{}-debian", ns.name));
    let missing_class = format!("{}-missing", ns.name);
    let mut locked = sim_provider("locked", &format!("sim://{}-locked", ns.name), json!({}));
    locked["spec"]["connection"]["credentialsRef"] = json!({"name": "locked-credentials"});
    let fixtures = [
        sim_provider(
            "sim",
            &format!("sim://{}", ns.name),
            json!({"latency": "100ms"}),
        ),
        locked,
        // The Provider's own checks succeed; every machine it is asked to make fails for good.
        sim_provider(
            "faulty",
            &format!("sim://{}-faulty", ns.name),
            json!({"failureRate": "1", "failureKinds": "terminal", "failureCalls": "ensure"}),
        ),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"sim": {"name": "debian"}}}}),
        vm("web", &class, &image, "sim"),
        vm("no-class", &missing_class, &image, "sim"),
        vm("stuck", &class, &image, "locked"),
        vm("doomed", &class, &image, "faulty"),
    ];
    for object in &fixtures {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let _operator = Operator::start(ns.client.clone(), &ns.name);

    let vms: Api<VirtualMachine> = ns.api();
    let providers: Api<Provider> = ns.api();
    let ready = |vm: &VirtualMachine| reason(vm, "Ready").as_deref() == Some("Ready");
    let web = wait_for(&vms, "web", WAIT, ready).await;
    wait_for(&vms, "no-class", WAIT, |vm| {
        reason(vm, "Scheduled").as_deref() == Some("ClassNotFound")
    })
    .await;
    wait_for(&providers, "locked", WAIT, |p| {
        p.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready"))
            .is_some_and(|c| c.reason == "CredentialsNotFound")
    })
    .await;
    wait_for(&vms, "stuck", WAIT, |vm| {
        reason(vm, "Scheduled").is_some_and(|r| r != "Scheduled")
    })
    .await;
    wait_for(&vms, "doomed", WAIT, |vm| {
        reason(vm, "InfrastructureReady").as_deref() == Some("TerminalFailure")
    })
    .await;

    // get: one row per VM, the reason being the first failing link.
    let table = stdout_of(&["get", "-n", &ns.name]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PROVIDER",
            "BACKEND",
            "FAILURE-DOMAIN",
            "POWER",
            "READY",
            "REASON",
            "ADDRESSES",
            "AGE"
        ]
    );
    let addresses = &web.status.as_ref().unwrap().addresses;
    let joined: Vec<&str> = addresses.iter().map(|a| a.address.as_str()).collect();
    let joined = joined.join(",");
    let address = &addresses
        .iter()
        .find(|a| a.type_ == MachineAddressType::InternalIp)
        .expect("an InternalIP")
        .address;
    let web_row = row(&table, "web");
    assert_eq!(
        &web_row[1..8],
        [
            "sim",
            "sim",
            web_row[3],
            "PoweredOn",
            "True",
            "Ready",
            joined.as_str()
        ],
        "{table}"
    );
    assert!(web_row[3].starts_with("sim-"), "failure domain: {table}");
    assert_eq!(
        row(&table, "no-class")[5..7],
        ["False", "ClassNotFound"],
        "{table}"
    );
    assert_eq!(row(&table, "stuck")[5], "False", "{table}");
    assert_eq!(
        row(&table, "doomed")[5..7],
        ["False", "TerminalFailure"],
        "{table}"
    );
    assert_eq!(table.lines().count(), 5, "{table}");

    let one = stdout_of(&["get", "web", "-n", &ns.name]).await;
    assert_eq!(one.lines().count(), 2, "{one}");
    let everywhere = stdout_of(&["get", "-A"]).await;
    assert!(everywhere.starts_with("NAMESPACE"), "{everywhere}");
    assert!(
        everywhere
            .lines()
            .any(|l| l.starts_with(&format!("{} ", ns.name)) && l.contains(" doomed ")),
        "{everywhere}"
    );

    // describe: why, link by link.
    let report = stdout_of(&["describe", "no-class", "-n", &ns.name]).await;
    assert!(
        report.contains(&format!(
            "Why: VMClass {missing_class:?} is not OK: ClassNotFound"
        )),
        "{report}"
    );
    assert!(
        report.contains(&format!("Hint: create VMClass {missing_class:?}")),
        "{report}"
    );

    let report = stdout_of(&["describe", "stuck", "-n", &ns.name]).await;
    assert!(
        report.contains("Why: Provider \"locked\" is not OK: CredentialsNotFound"),
        "{report}"
    );
    assert!(
        report.contains("Hint: create the Secret \"locked-credentials\""),
        "{report}"
    );

    let report = stdout_of(&["describe", "doomed", "-n", &ns.name]).await;
    assert!(
        report.contains("Why: LibvirtMachine \"doomed\" is not OK: TerminalFailure: SimulatedFault: injected terminal fault in ensure"),
        "{report}"
    );
    assert!(report.contains("Hint: retrying cannot help"), "{report}");
    assert!(
        report.contains("  ok   Provider \"faulty\""),
        "the Provider itself is fine:\n{report}"
    );

    let report = stdout_of(&["describe", "web", "-n", &ns.name]).await;
    assert!(report.contains("\nReady: True\n"), "{report}");
    assert!(!report.contains("  NOT  "), "{report}");
    assert!(
        report.contains(&format!("ssh:     ssh <user>@{address}")),
        "{report}"
    );

    let missing = kubectl_banlieue(&["describe", "nope", "-n", &ns.name]).await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(
        stderr.contains(&format!(
            "VirtualMachine \"nope\" not found in namespace {:?}",
            ns.name
        )),
        "{stderr}"
    );
}
