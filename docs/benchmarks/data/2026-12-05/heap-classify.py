#!/usr/bin/env python3
"""Where an operator's heap was at its peak, by what holds it.

Input: heaptrack's peak flamegraph stacks (`heaptrack_print -f FILE.zst -F stacks.txt
--flamegraph-cost-type peak`). Each stack's bytes go to the first class whose test it
passes, so the rows add up to the peak. Usage: heap-classify.py stacks.txt N
"""
import collections
import re
import sys


def clean(frame):
    frame = re.sub(r"::h[0-9a-f]{16}", "", frame).strip()
    for old, new in (("$LT$", "<"), ("$GT$", ">"), ("$u20$", " "), ("$C$", ","),
                     ("..", "::"), ("$u7b$", "{"), ("$u7d$", "}")):
        frame = frame.replace(old, new)
    return frame


def cache(s):
    return "apply_watcher_event" in s or "Reflect<" in s


CLASSES = [
    ("VirtualMachine cache (the VM controller's reflector)",
     lambda s: "virtual_machine::run" in s and cache(s)),
    ("infra machine cache (the shared feed's reflector)",
     lambda s: "feed::run" in s and cache(s)),
    ("other caches (Providers, classes, images, ...)", cache),
    ("provider-ID claims index", lambda s: "claims::" in s),
    ("placement ledger (decided, not yet in the cache)",
     lambda s: "virtual_machine::decide" in s),
    ("the sim backend's simulated VMs", lambda s: "banlieue_backend_sim" in s),
    ("controller queues (kube-runtime scheduler: pending requeues)",
     lambda s: any(k in s for k in ("delay_queue", "scheduler::Hold", "scheduler::Scheduler"))),
    ("watch responses being decoded",
     lambda s: any(k in s for k in ("watcher::step", "EventDecode", "request_text"))),
    ("HTTP/TLS buffers", lambda s: any(k in s for k in ("hyper", "rustls", "h2::"))),
    ("reconciles in flight",
     lambda s: "virtual_machine::" in s or "controllers::machine::" in s),
]


def main(path, n):
    held = collections.Counter()
    total = 0
    for line in open(path):
        stack, _, cost = line.rstrip().rpartition(" ")
        stack, cost = clean(stack), int(cost)
        total += cost
        name = next((name for name, test in CLASSES if test(stack)), "everything else")
        held[name] += cost
    print("| what | MB at peak | bytes per VM |\n|---|---:|---:|")
    for name in [name for name, _ in CLASSES] + ["everything else"]:
        print(f"| {name} | {held[name] / 1e6:.2f} | {held[name] / n:.0f} |")
    print(f"| **heap at peak** | **{total / 1e6:.2f}** | **{total / n:.0f}** |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
