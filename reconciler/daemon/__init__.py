"""Stage 5, daemon: `nftrec watch`, the GitOps reconcile loop.

    watcher (file events, debounced) ─► runner (kube-proxy's BoundedFrequencyRunner)
        ─► reconcile.Daemon.sync: intake.Intake → compile.compile_incremental → engine.sync
    main wires them with signals, the namespace lock, and metrics (/metrics, /healthz, /readyz).
"""

from reconciler import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {"main": ("run_watch",)})
