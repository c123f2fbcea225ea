"""What the machine can do: its GPUs, their peak rates, transfer bandwidth, reference figures and rate plots.

- `gpus`: which GPUs a machine has, how much memory is free on each, which a job should use; notebook 03.
- `peak_flops`: the peak arithmetic rate of common NVIDIA GPUs, the denominator of MFU; notebook 07.
- `peak_bandwidth`: the peak memory bandwidth of common NVIDIA GPUs, the denominator of MBU; notebook 10.
- `transfer`: host-to-device transfer bandwidth, pinned and pageable; notebook 02.
- `rate_plots`: rate-against-size sweeps, bar charts of rates and the CPU/GPU picture; notebook 01.
- `reference_figures`: reference figures of the course's timers on other machines; appendix 90.
"""

__all__ = ["gpus", "peak_bandwidth", "peak_flops", "rate_plots", "reference_figures", "transfer"]
