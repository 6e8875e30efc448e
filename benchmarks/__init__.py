"""Speed, memory and accuracy benchmarks, and the fused kernels' report, run from the
repository root. A package so that ``python -m benchmarks.kernel_report`` runs and the compile
gate (``tests/plugins/test_kernel_compile.py``) imports the same compile machinery
(``benchmarks.kernel_build``, ``benchmarks.kernel_reach``) as the report; the scripts run as
files too (``python benchmarks/bench_losses.py``)."""
