"""The benchmarks (GPU), run as `python -m cute_fa bench ...`: one module per benchmark (`grid`,
`prefill`, `decode`, `backward`, `host`), each with `main(out_dir, quick)`, over a shared
`common` (the one timer, the peers, FLOPs, report helpers, datasheet peaks); `ab`, the
same-process A/B of the backward's tile tables that docs/perf's scripts run."""
