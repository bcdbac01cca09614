"""What cudnnnet-benchmark (``cli/benchmark.py``) measures and reports.

    settings.py          the workloads, their sizes, each device's defaults, the targets
    measuring.py         timing calls and epochs, the device memory a workload takes
    workloads.py         mlp and cnn (the Trainer), micro (one network step), run in this process
    original.py          the original workload: whole training processes, timed by wall clock
    torch_reference.py   the same workloads with PyTorch, for comparison
    report.py            the run as a whole (build_report), the table and its text
"""
