"""Dense peak matmul FLOP/s of common accelerators, per chip, for `t5x-lite estimate`.

Every figure is the vendor's *dense* number. NVIDIA's datasheets print tensor-core figures
"with sparsity" (2:4 structured sparsity, twice the dense rate) first; those are halved here,
because training a dense model never runs at them. Google's Cloud TPU pages give the peak
bf16 compute per chip, which is dense. Memory is the vendor's nominal HBM per chip.

Columns (FLOP/s per chip; None where the chip has no such unit):
  bf16  tensor-core / MXU bfloat16 matmuls with float32 accumulation
  tf32  tensor-core TF32 matmuls (NVIDIA Ampere and later)
  fp32  plain float32 (CUDA-core FMA) throughput
`float32_matmul` names the column a float32 matmul runs at under JAX's default precision:
TF32 on NVIDIA Ampere and later, bf16 passes on TPUs, true fp32 on Volta.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from t5x_lite.errors import ConfigValueError

T = 1e12
P = 1e15


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One chip's dense peak rates (FLOP/s), nominal memory (GB) and where the numbers come from."""

    name: str
    bf16: float | None
    tf32: float | None
    fp32: float | None
    memory_gb: float
    float32_matmul: str
    source: str

    @property
    def platform(self) -> str:
        """JAX's backend name for the chip: 'tpu' or 'gpu'."""
        return "tpu" if self.name.startswith("tpu-") else "gpu"


ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): BF16 312 | 624 sparse, TF32 156 | 312 sparse, FP32 19.5.
    Accelerator("a100-40gb", bf16=312 * T, tf32=156 * T, fp32=19.5 * T, memory_gb=40, float32_matmul="tf32",
                source="NVIDIA A100 datasheet (SXM), dense"),
    Accelerator("a100-80gb", bf16=312 * T, tf32=156 * T, fp32=19.5 * T, memory_gb=80, float32_matmul="tf32",
                source="NVIDIA A100 datasheet (SXM), dense"),
    # NVIDIA H100 datasheet, SXM: BF16 1,979 sparse, TF32 989 sparse, FP32 67.
    Accelerator("h100-sxm", bf16=989.4 * T, tf32=494.7 * T, fp32=67 * T, memory_gb=80, float32_matmul="tf32",
                source="NVIDIA H100 datasheet (SXM), sparse figures halved"),
    # NVIDIA H100 datasheet, PCIe: BF16 1,513 sparse, TF32 756 sparse, FP32 51.
    Accelerator("h100-pcie", bf16=756.5 * T, tf32=378 * T, fp32=51 * T, memory_gb=80, float32_matmul="tf32",
                source="NVIDIA H100 datasheet (PCIe), sparse figures halved"),
    # NVIDIA H200 datasheet, SXM: the H100 SXM's compute with 141 GB of HBM3e.
    Accelerator("h200", bf16=989.4 * T, tf32=494.7 * T, fp32=67 * T, memory_gb=141, float32_matmul="tf32",
                source="NVIDIA H200 datasheet (SXM), sparse figures halved"),
    # NVIDIA HGX B200 datasheet (8 GPUs, 1000 W each): FP16/BF16 36 PF sparse, TF32 18 PF sparse,
    # FP32 600 TF, 1,440 GB; per GPU: / 8, sparse figures halved.
    Accelerator("b200", bf16=2.25 * P, tf32=1.125 * P, fp32=75 * T, memory_gb=180, float32_matmul="tf32",
                source="NVIDIA HGX B200 datasheet, per GPU, sparse figures halved"),
    # NVIDIA L4 datasheet: BF16 242 sparse, TF32 120 sparse, FP32 30.3.
    Accelerator("l4", bf16=121 * T, tf32=60 * T, fp32=30.3 * T, memory_gb=24, float32_matmul="tf32",
                source="NVIDIA L4 datasheet, sparse figures halved"),
    # NVIDIA L40S datasheet: BF16 362.05 | 733 sparse, TF32 183 | 366 sparse, FP32 91.6.
    Accelerator("l40s", bf16=362.05 * T, tf32=183 * T, fp32=91.6 * T, memory_gb=48, float32_matmul="tf32",
                source="NVIDIA L40S datasheet, dense"),
    # NVIDIA V100 datasheet (SXM2): FP32 15.7; its tensor cores do FP16 (125), not bfloat16 or TF32.
    Accelerator("v100", bf16=None, tf32=None, fp32=15.7 * T, memory_gb=32, float32_matmul="fp32",
                source="NVIDIA V100 datasheet (SXM2); no bf16/TF32 units (FP16 tensor cores: 125 TFLOP/s)"),
    # Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v3, v4, v5e, v5p, v6e):
    # "peak compute per chip (bf16)". Float32 matmuls at JAX's default precision run as bf16 passes.
    Accelerator("tpu-v3", bf16=123 * T, tf32=None, fp32=None, memory_gb=32, float32_matmul="bf16",
                source="cloud.google.com/tpu/docs/v3: 123 TFLOP/s bf16 per chip, 32 GiB"),
    Accelerator("tpu-v4", bf16=275 * T, tf32=None, fp32=None, memory_gb=32, float32_matmul="bf16",
                source="cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16 per chip, 32 GiB"),
    Accelerator("tpu-v5e", bf16=197 * T, tf32=None, fp32=None, memory_gb=16, float32_matmul="bf16",
                source="cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16 per chip, 16 GB"),
    Accelerator("tpu-v5p", bf16=459 * T, tf32=None, fp32=None, memory_gb=95, float32_matmul="bf16",
                source="cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16 per chip, 95 GB"),
    Accelerator("tpu-v6e", bf16=918 * T, tf32=None, fp32=None, memory_gb=32, float32_matmul="bf16",
                source="cloud.google.com/tpu/docs/v6e (Trillium): 918 TFLOP/s bf16 per chip, 32 GB"),
)}

# Other spellings people type, after normalisation (lower case, letters and digits only).
ALIASES: dict[str, str] = {
    "a100": "a100-80gb", "a10040g": "a100-40gb", "a10080g": "a100-80gb",
    "h100": "h100-sxm", "h100sxm5": "h100-sxm", "h200sxm": "h200",
    "v100sxm2": "v100", "v10032gb": "v100",
    "v3": "tpu-v3", "v4": "tpu-v4", "v5e": "tpu-v5e", "v5litepod": "tpu-v5e", "v5p": "tpu-v5p",
    "v6e": "tpu-v6e", "trillium": "tpu-v6e",
}


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def get(name: str) -> Accelerator:
    """The accelerator called `name` (case, spaces, '-' and '_' ignored); an unknown name is a
    ConfigValueError that lists the known names and suggests the nearest."""
    key = _normalise(name)
    by_key = {_normalise(n): n for n in ACCELERATORS}
    found = by_key.get(key) or ALIASES.get(key)
    if found:
        return ACCELERATORS[found]
    close = difflib.get_close_matches(key, list(by_key) + list(ALIASES), n=1, cutoff=0.5)
    hint = f" Did you mean {by_key.get(close[0]) or ALIASES[close[0]]!r}?" if close else ""
    raise ConfigValueError(f"Unknown accelerator {name!r}.{hint} Known: {', '.join(ACCELERATORS)} "
                           "(or give --peak_flops=FLOP/s per device).")


def peak_flops(accelerator: Accelerator, dtype: str) -> tuple[float, str]:
    """(dense peak FLOP/s per chip, the column used) for matmuls of a model computing in `dtype`.

    bfloat16 uses the bf16 column; float32 the column JAX's default precision runs at on that chip.
    A chip without the column (bfloat16 on a V100) falls back to its fp32 rate.
    """
    column = "bf16" if dtype == "bfloat16" else accelerator.float32_matmul
    value = getattr(accelerator, column)
    if value is None:
        return accelerator.fp32, "fp32"
    return value, column
