"""Stage 4, engine: the commands that act on the kernel, and what they keep.

    desired (intake + compile) ─► changes (desired vs live) ─► plan (+ ~ - per Service)
        ─► sync (one transaction, verified) ─► state (status, history), under lock

`apply` is plan, apply and status; `noop` is their fast path for unchanged input;
`recorded` reads the last applied ruleset lazily for a one-Service change; `commits` is
the small record written at each commit, before the history; `confirm` is a confirmed
apply's window and its rollback; `teardown` is cleanup; `restore` reads the last applied ruleset back for `apply --restore`; `doctor` checks the host;
`planfile` is a saved plan; `target` says where a command acts; `review` is `nftrec diff`
(two manifest trees or git revisions, planned against each other without a kernel);
`trace` explains one packet with the desired or the live ruleset, `kerneltrace` traces a
real one with the kernel's `meta nftrace`; `effective` prints a node's effective manifests; `rollout` and `holds` decide
whether a fleet node takes a revision now (waves, the local hold). `source` turns an `oci://` argument into the
tree a command reads; `sourcestate` is `watch oci://`'s source for `status`;
`statusrecords` pushes the node's outcomes to a git remote and reads the fleet's back.
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "apply": ("EXIT_CHANGES", "EXIT_ERROR", "EXIT_OK", "run_apply", "run_plan", "run_status"),
    "changes": ("diff",),
    "commits": ("Commit", "adopt_commit", "append_commit", "commit_ahead", "read_commits", "rollback_baseline"),
    "confirm": ("ConfirmSpec", "await_confirmation", "begin_confirm", "clear_pending", "mark_confirmed",
                "pending_path", "record_confirmed", "recover_locked", "recover_pending", "roll_back", "run_confirm"),
    "desired": ("Desired", "InvalidInput", "Unverified", "check_signed", "judge", "load_desired", "trust_of", "node_address_discovery", "node_ip_discovery"),
    "doctor": ("run_doctor",),
    "effective": ("write_manifests",),
    "entry": ("guard", "intake_cache_dir", "record_invalid"),
    "guards": ("applied_services", "removal_refusal"),
    "holds": ("hold_path", "hold_status_json", "hold_status_lines", "parse_until", "read_hold", "run_hold", "run_release"),
    "lock": ("LockHeld",),
    "noop": ("config_cache_dir", "run_apply_noop", "run_plan_noop"),
    "plan": ("make_plan",),
    "probes": ("probe_desired", "read_probe_state", "write_probe_state"),
    "fleetreview": ("run_diff_fleet", "run_validate_fleet"),
    "fleetstatus": ("run_fleet_status",),
    "restore": ("RestoreRefused", "last_applied", "run_restore"),
    "review": ("run_diff",),
    "rollout": ("EXIT_HELD", "Gate", "fleet_rollout", "jitter", "one_shot", "records_fetcher", "status_record",
                "time_of"),
    "source": ("KEEP", "command_source", "is_source", "manifest_root", "open_source", "reference", "source_error"),
    "sourcestate": ("read_source_state", "source_status_json", "source_status_lines", "write_source_state"),
    "statusrecords": ("StatusChannel", "StatusSettings", "fetch_records", "parse_record", "record_json"),
    "state": ("StateCorrupt", "default_state_dir", "namespace_dir", "read_history", "read_status", "utc_now"),
    "sync": ("clean_udp_conntrack", "commit", "forget_affinity_clients", "forgotten_affinity_ids", "touched_objects", "udp_services", "verify_applied", "verify_commit",
             "verify_touched"),
    "target": ("CommandError", "Target", "short_revision"),
    "teardown": ("KUBE_PROXY_TABLE", "cleanup", "run_cleanup"),
    "kerneltrace": ("run_kernel_trace",),
    "trace": ("UnknownExpression", "trace_packet"),
    "tracecommand": ("run_trace",),
    "tracereport": ("Packet",),
    "verify": ("slim_created",),
})
