"""TEST DOUBLE: a fake QAIRT SDK folder. Each CLI is a small Python script that records its argv and
environment (one JSON line in `<root>/calls.jsonl`), rejects flags its SDK version does not have
(exit 2, like argparse), and writes the output files named on its command line. It converts
nothing: the product never fakes a conversion; this only exercises how the qairt toolchain drives
the real CLIs (argv, flags per version, environment, outputs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FLAGS: dict[str, dict[str, list[str]]] = {
    "2.20": {
        "qairt-converter": ["--input_network", "--output_path", "--desired_input_shape", "--float_bitwidth"],
        "qairt-quantizer": ["--input_dlc", "--output_dlc", "--input_list", "--act_bitwidth", "--weights_bitwidth"],
        "snpe-onnx-to-dlc": ["--input_network", "--output_path", "--input_dim"],
        "snpe-dlc-quantize": ["--input_dlc", "--output_dlc", "--input_list", "--act_bitwidth"],
        "snpe-dlc-graph-prepare": ["--input_dlc", "--output_dlc", "--htp_socs"],
        "qnn-context-binary-generator": ["--dlc_path", "--backend", "--output_dir", "--binary_file"],
        "snpe-dlc-info": ["--input_dlc", "--save"],
    },
    "2.31": {
        "qairt-converter": ["--input_network", "--output_path", "--source_model_input_shape", "--float_bitwidth"],
        "qairt-quantizer": ["--input_dlc", "--output_dlc", "--input_list", "--act_bitwidth", "--weights_bitwidth"],
        "snpe-onnx-to-dlc": ["--input_network", "--output_path", "--source_model_input_shape"],
        "snpe-dlc-quant": ["--input_dlc", "--output_dlc", "--input_list", "--act_bitwidth"],
        "snpe-dlc-graph-prepare": ["--input_dlc", "--output_dlc", "--htp_socs"],
        "qnn-context-binary-generator": ["--dlc_path", "--backend", "--output_dir", "--binary_file"],
        "snpe-dlc-info": ["--input_dlc", "--save"],
    },
}
OUTPUT_FLAGS = ("--output_path", "--output_dlc", "--save")

_SCRIPT = '''#!{python}
import json, os, sys
from pathlib import Path
TOOL, VERSION, LOG, HOLD = {tool!r}, {version!r}, {log!r}, {hold!r}
FLAGS = {flags!r}
args = sys.argv[1:]
with open(LOG, "a") as f:
    f.write(json.dumps({{"tool": TOOL, "argv": args, "cwd": os.getcwd(),
                        "env": {{k: os.environ.get(k, "") for k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "QAIRT_SDK_ROOT")}}}}) + "\\n")
opts = {{}}
i = 0
while i < len(args):
    flag = args[i]
    if flag not in FLAGS:
        sys.stderr.write(f"{{TOOL}} {{VERSION}}: error: unrecognized arguments: {{flag}}\\n")
        sys.exit(2)
    opts[flag] = args[i + 1] if i + 1 < len(args) else ""
    i += 2
if HOLD:  # a long-running tool: block until the test creates the release file (bounded)
    import time
    deadline = time.monotonic() + 120
    while not os.path.exists(HOLD):
        if time.monotonic() > deadline:
            sys.stderr.write(f"{{TOOL}}: never released ({{HOLD}})\\n")
            sys.exit(3)
        time.sleep(0.05)
for flag in {outputs!r}:
    if flag in opts:
        p = Path(opts[flag]); p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(f"FAKE {{TOOL}} {{VERSION}} {{opts}}".encode())
if "--binary_file" in opts:
    d = Path(opts.get("--output_dir", ".")); d.mkdir(parents=True, exist_ok=True)
    (d / (opts["--binary_file"] + ".bin")).write_bytes(f"FAKE context binary {{VERSION}} {{opts}}".encode())
print(f"{{TOOL}} {{VERSION}} ok")
'''


def build_fake_sdk(parent: Path, version: str = "2.31", *, with_yaml: bool = True,
                   hold: tuple[str, Path] | None = None) -> Path:
    """A fake SDK under `parent/qairt/<version>.0.250130`; returns its root (QAIRT_SDK_ROOT).
    `hold=(tool, release_file)`: that tool records its call, then blocks until `release_file` exists
    (a long executor step a crash test can kill the worker in)."""
    root = parent / "qairt" / f"{version}.0.250130"
    bin_dir = root / "bin" / "x86_64-linux-clang"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (root / "lib" / "x86_64-linux-clang").mkdir(parents=True, exist_ok=True)
    (root / "lib" / "python").mkdir(parents=True, exist_ok=True)
    if with_yaml:
        (root / "sdk.yaml").write_text(f"name: qairt\nversion: {version}.0.250130\n")
    for tool, flags in FLAGS[version].items():
        p = bin_dir / tool
        p.write_text(_SCRIPT.format(python=sys.executable, tool=tool, version=version, log=str(root / "calls.jsonl"),
                                    flags=flags, outputs=list(OUTPUT_FLAGS),
                                    hold=str(hold[1]) if hold and hold[0] == tool else ""))
        p.chmod(0o755)
    return root


def calls(root: Path) -> list[dict]:
    """Every recorded CLI call, in order."""
    log = root / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
