"""Regenerate the committed Python code of the control protocol from `protos/control.proto`.

    python protos/generate.py            # rewrites elastic/protocol/control_pb2{.py,.pyi,_grpc.py}
    python protos/generate.py --out DIR  # writes the three files into DIR instead

Uses `grpc_tools.protoc` (the `grpcio-tools` version pinned in the dev extras: the output
depends on it, and `tests/unit/driver/control/test_control.py` fails when the committed files
differ from it).

The .proto is compiled as `elastic/protocol/control.proto` (a staged copy), not as
`control.proto`: protoc then writes `from elastic.protocol import control_pb2` in the gRPC
module instead of a bare `import control_pb2`, and the descriptor registered in protobuf's
process-wide pool gets a name no other library's `control.proto` can collide with.
"""

from __future__ import annotations

import argparse
import importlib.resources
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "protos" / "control.proto"
PACKAGE = "elastic/protocol"
OUTPUTS = ("control_pb2.py", "control_pb2.pyi", "control_pb2_grpc.py")
QUALIFIED_IMPORT = "from elastic.protocol import control_pb2 as "


def generate(out: Path) -> list[Path]:
    """Write the generated modules into `out`; return their paths. Raises RuntimeError when
    protoc fails or its output does not import the pb2 module by its package path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        stage, build = Path(scratch, "stage"), Path(scratch, "build")
        (stage / PACKAGE).mkdir(parents=True)
        build.mkdir()
        shutil.copyfile(SOURCE, stage / PACKAGE / "control.proto")
        well_known = importlib.resources.files("grpc_tools") / "_proto"
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{stage}",
                f"-I{well_known}",
                f"--python_out={build}",
                f"--pyi_out={build}",
                f"--grpc_python_out={build}",
                f"{PACKAGE}/control.proto",
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed on {SOURCE} (exit status {status})")
        grpc_module = (build / PACKAGE / "control_pb2_grpc.py").read_text()
        if QUALIFIED_IMPORT not in grpc_module:
            raise RuntimeError("the generated gRPC module does not import elastic.protocol")
        written = []
        for name in OUTPUTS:
            target = out / name
            shutil.copyfile(build / PACKAGE / name, target)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / PACKAGE, help="directory to write the modules into"
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
