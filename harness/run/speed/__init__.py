"""The speed part: what makes a check fast, behind one interface; a check is correct without it.

- settings.py: `Settings`, how a process runs, read from the ATTN_HARNESS_* variables once
  (`current`, `use`, `reset`).
- parts.py: `plan_check` plans a parallel check's parts from the measured costs (schedule.py,
  costs.py); `PlannedCheck.keep` saves what they took for the next plan.
- variant_shards.py: which shard of a backend checks which case (`configure`, `elsewhere`,
  `answer`, `save_measured`).
- prestart.py: the isolation worker spawned as a part's pytest process starts (`claim`).
- warm_gate.py: `WarmGate`, the warm-up beside a CUDA check, holding a backend's parts until its
  libraries are compiled (warmup/: the libraries, one ninja build, stamps).

Nothing here is imported at this package's import: prestart.py, loaded before torch, costs only
the standard library. docs/design.md ("The speed part") gives the reasons for each mechanism.
"""
