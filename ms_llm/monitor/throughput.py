"""FLOPs per token, model FLOPs utilisation (MFU) and memory in use."""
import os
import resource

# Dense peak TFLOP/s per device for the compute dtypes used in training. Override with monitor.peak_tflops.
DEVICE_PEAK_TFLOPS = {"Ascend": 280.0, "GPU": 312.0}


def cpu_flops_per_cycle(flags, vendor):
    """fp32 FLOPs per cycle per core: two FMA pipes x SIMD lanes x 2. AVX-512 counts as 512-bit pipes
    except on AMD before Zen 5 (Zen 4 runs it on 256-bit pipes; Zen 5 adds avx512_vp2intersect)."""
    if "avx512f" in flags and ("AMD" not in vendor or "avx512_vp2intersect" in flags):
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    return 16


def flops_per_token(num_params, num_layers, hidden, seq_length):
    """Training FLOPs per token: 6N for the dense matmuls (forward + backward) plus 12*L*h*s for attention
    (PaLM appendix B; nanoGPT's estimate_mfu). N excludes learned position tables, which are looked up,
    not multiplied."""
    return 6 * num_params + 12 * num_layers * hidden * seq_length


def cpu_peak_tflops():
    """Cores available to this process x clock x FLOPs/cycle: an upper bound the CPU cannot exceed."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    mhz, flags, vendor = 2500.0, set(), ""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.readlines()
        speeds = [float(line.split(":")[1]) for line in lines if line.startswith("cpu MHz")]
        mhz = max(speeds) if speeds else mhz
        flags = set(next((line.split(":")[1].split() for line in lines if line.startswith("flags")), []))
        vendor = next((line.split(":")[1].strip() for line in lines if line.startswith("vendor_id")), "")
    except OSError:
        pass
    return cores * mhz * 1e6 * cpu_flops_per_cycle(flags, vendor) / 1e12


def peak_tflops(device_target, configured=None):
    if configured:
        return configured
    if device_target == "CPU":
        return cpu_peak_tflops()
    return DEVICE_PEAK_TFLOPS.get(device_target, 100.0)


def memory_gib(device_target):
    """Device memory in use (GiB); on CPU, where the runtime reports 0, the process's resident set."""
    if device_target != "CPU":
        try:
            import mindspore as ms

            return ms.runtime.memory_allocated() / 2**30
        except Exception:  # older runtimes lack the API: fall back to host memory
            pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return peak_memory_gib("CPU")


def peak_memory_gib(device_target):
    if device_target != "CPU":
        try:
            import mindspore as ms

            return ms.runtime.max_memory_allocated() / 2**30
        except Exception:
            pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
