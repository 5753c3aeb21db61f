"""S3Store throughput and peak memory on a large file, against plain boto3, in one run.

Starts moto's S3 server on 127.0.0.1, writes a file of random data, then runs each operation in
its own child process (so its peak RSS, read with getrusage in the child, is that operation's
alone): fleetforge put_file, fleetforge get_file, boto3 upload_file and download_file. Prints a table, the ratio
fleetforge put / boto3 upload, and PASS/FAIL against the peak-RSS target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

RSS_TARGET_MIB = 150
WRITE_CHUNK = 8 * 1024 * 1024


def _child(op: str, endpoint: str, bucket: str, path: Path, ref_json: str) -> None:
    """Run one operation and print {"seconds", "peak_rss_mib", ...} as JSON on stdout."""
    import boto3

    from activities.storage import S3Store, blob_key
    from contracts.common import ArtifactRef

    out: dict[str, object] = {}
    store = S3Store(bucket, "bench", endpoint_url=endpoint)
    t0 = time.perf_counter()
    if op == "ff_put":
        out["ref"] = store.put_file(path).model_dump(mode="json")
    elif op == "ff_get":
        store.get_file(ArtifactRef.model_validate_json(ref_json), path)
    elif op == "boto3_upload":
        boto3.client("s3", endpoint_url=endpoint).upload_file(str(path), bucket, f"plain/{uuid.uuid4().hex}")
    elif op == "boto3_download":
        key = store._key(blob_key(ArtifactRef.model_validate_json(ref_json).sha256))
        boto3.client("s3", endpoint_url=endpoint).download_file(bucket, key, str(path))
    else:
        raise SystemExit(f"unknown op {op!r}")
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(out))


def _peak_rss_mib() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a
    child spawned by a big parent (moto holds the uploaded data) would report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_child(op: str, endpoint: str, bucket: str, path: Path, ref_json: str = "") -> dict:
    cmd = [sys.executable, "-m", "bench.bench_storage", "--child", op, "--endpoint", endpoint,
           "--bucket", bucket, "--path", str(path), "--ref", ref_json]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise SystemExit(f"{op} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _write_random_file(path: Path, size_mib: int) -> None:
    """Real data on disk (not sparse), written chunk by chunk so the parent stays small."""
    remaining = size_mib * 1024 * 1024
    with open(path, "wb") as f:
        while remaining:
            n = min(WRITE_CHUNK, remaining)
            f.write(os.urandom(n))
            remaining -= n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024, help="size of the test file (default 1024)")
    p.add_argument("--workdir", type=Path, default=None, help="where to write the test file (default: a temp dir)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    p.add_argument("--bucket", default="", help=argparse.SUPPRESS)
    p.add_argument("--path", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ref", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    for var, val in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(var, val)
    if args.child:
        _child(args.child, args.endpoint, args.bucket, args.path, args.ref)
        return 0

    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per part otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    work = Path(tempfile.mkdtemp(prefix="ff-bench-", dir=args.workdir))
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)

        src = work / "src.bin"
        t0 = time.perf_counter()
        _write_random_file(src, args.size_mib)
        print(f"wrote {args.size_mib} MiB test file in {time.perf_counter() - t0:.1f}s; moto at {endpoint}", flush=True)

        results: dict[str, dict] = {}
        results["fleetforge put_file"] = put = _run_child("ff_put", endpoint, bucket, src)
        results["fleetforge get_file"] = _run_child("ff_get", endpoint, bucket, work / "dl.bin", json.dumps(put["ref"]))
        results["boto3 upload_file"] = _run_child("boto3_upload", endpoint, bucket, src)
        (work / "dl.bin").unlink()
        results["boto3 download_file"] = _run_child("boto3_download", endpoint, bucket, work / "dl.bin", json.dumps(put["ref"]))

        print(f"\n{'operation':<22} {'seconds':>8} {'MiB/s':>8} {'peak RSS MiB':>13}")
        for name, r in results.items():
            print(f"{name:<22} {r['seconds']:>8.2f} {args.size_mib / r['seconds']:>8.1f} {r['peak_rss_mib']:>13.1f}")
        ratio = results["fleetforge put_file"]["seconds"] / results["boto3 upload_file"]["seconds"]
        print(f"\nfleetforge put_file / boto3 upload_file time: {ratio:.2f}x (put_file also hashes the file)")
        get_ratio = results["fleetforge get_file"]["seconds"] / results["boto3 download_file"]["seconds"]
        print(f"fleetforge get_file / boto3 download_file time: {get_ratio:.2f}x (get_file also verifies sha256)")
        worst = max(results["fleetforge put_file"]["peak_rss_mib"], results["fleetforge get_file"]["peak_rss_mib"])
        verdict = "PASS" if worst < RSS_TARGET_MIB else "FAIL"
        print(f"peak RSS target < {RSS_TARGET_MIB} MiB for fleetforge put/get: {verdict} (worst {worst:.1f} MiB)")
        return 0 if verdict == "PASS" else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
