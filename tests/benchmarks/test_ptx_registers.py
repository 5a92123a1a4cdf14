"""benchmarks/gpu/ptx_registers.py: ptxas -v's report read into registers and spills per kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "ptx_registers.py"
sys.path.insert(0, str(SCRIPT.parent))
import ptx_registers  # noqa: E402

REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gdn2_gpu_prepare' for 'sm_90a'
ptxas info    : Function properties for gdn2_gpu_prepare
    1032 bytes stack frame, 1080 bytes spill stores, 1196 bytes spill loads
ptxas info    : Used 255 registers, 392 bytes cmem[0]
ptxas info    : Compiling entry function 'loop_add_fusion' for 'sm_90a'
ptxas info    : Function properties for loop_add_fusion
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 380 bytes cmem[0]
"""


def test_each_function_gets_its_registers_and_spills() -> None:
    rows = ptx_registers.parse(REPORT)
    assert rows == [
        {"function": "gdn2_gpu_prepare", "registers": 255, "spill_stores": 1080, "spill_loads": 1196},
        {"function": "loop_add_fusion", "registers": 12, "spill_stores": 0, "spill_loads": 0},
    ]


def test_a_folder_without_ptx_is_refused_in_one_line(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip() == f"ptx_registers: no .ptx file under {tmp_path}"
