"""DeepSpeed preflight: versions, toolchain, and a JIT build plus a real use of each op the peers need.

DeepSpeed travels to the GPU machine as a pure-Python wheel (``DS_BUILD_OPS=0``); its CPU Adam
(``cpu_adam``, ZeRO-Offload's optimizer) and its async I/O (``async_io``, ZeRO-Infinity's NVMe path,
linked against libaio) are compiled there on first use by ``torch.utils.cpp_extension``. This script
builds both, each in its own process under a time limit and at the same time, uses each once (one
DeepSpeedCPUAdam step checked against ``torch.optim.AdamW``; one aio write and read of a pinned buffer
checked bitwise), and writes one record saying what worked or the exact failure. The harness reads it
(``PEERS_DS_PREFLIGHT``): a DeepSpeed row whose op did not build carries that failure as its reason.

Usage: python ds_preflight.py --out DIR [--aio-dir DIR] [--timeout S]
       python ds_preflight.py --op cpu_adam|async_io [--aio-dir DIR]   (one check; prints JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

NAME = "offload_peers_deepspeed_preflight"
ENV_KEYS = ("CC", "CPATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "CFLAGS", "LDFLAGS")  # what the builds read


def _check_cpu_adam() -> dict[str, Any]:
    """Build DeepSpeedCPUAdam (JIT) and compare one AdamW step with torch's on 1M parameters."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    gen = torch.Generator().manual_seed(0)
    start = torch.randn(1 << 20, generator=gen)
    grad = torch.randn(1 << 20, generator=gen)
    hp: dict[str, Any] = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    ours = torch.nn.Parameter(start.clone())
    theirs = torch.nn.Parameter(start.clone())
    t0 = time.perf_counter()
    opt = DeepSpeedCPUAdam([ours], adamw_mode=True, **hp)
    build_s = time.perf_counter() - t0
    ref = torch.optim.AdamW([theirs], **hp)
    for p, o in ((ours, opt), (theirs, ref)):
        p.grad = grad.clone()
        o.step()
    diff = float((ours.detach() - theirs.detach()).abs().max())
    return {"ok": diff < 1e-5, "build_and_load_s": build_s, "max_abs_diff_vs_torch_adamw": diff}


def _check_async_io(aio_dir: str) -> dict[str, Any]:
    """Build async_io (JIT, libaio) and write then read 16 MiB through one aio handle, bitwise."""
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    t0 = time.perf_counter()
    builder = AsyncIOBuilder()
    compatible = builder.is_compatible(verbose=True)
    if not compatible:  # DeepSpeed's probe swallows the compiler's words: run it again, saying them
        probe = _probe_libaio()
        why = "AsyncIOBuilder.is_compatible: io_submit from libaio did not compile/link"
        return {"ok": False, "reason": f"{why}; probe: {probe['outcome']}", "probe": probe}
    aio = builder.load(verbose=False)
    build_s = time.perf_counter() - t0
    handle = aio.aio_handle(1 << 20, 8, False, True, 1)  # block size, queue depth, single submit, overlap, threads
    # page-locked, page-aligned buffers from DeepSpeed's own allocator (O_DIRECT needs the alignment)
    src = handle.new_cpu_locked_tensor(16 << 20, torch.empty(0, dtype=torch.uint8))
    dst = handle.new_cpu_locked_tensor(16 << 20, torch.empty(0, dtype=torch.uint8))
    src.copy_(torch.randint(0, 255, (16 << 20,), dtype=torch.uint8))
    dst.zero_()
    Path(aio_dir).mkdir(parents=True, exist_ok=True)
    path = str(Path(aio_dir) / "ds_preflight.bin")
    handle.sync_pwrite(src, path)
    handle.sync_pread(dst, path)
    os.unlink(path)
    same = bool(torch.equal(src, dst))
    handle.free_cpu_locked_tensor(src)
    handle.free_cpu_locked_tensor(dst)
    return {"ok": same, "build_and_load_s": build_s, "roundtrip_bitwise_equal": same, "aio_dir": aio_dir}


def _probe_libaio() -> dict[str, Any]:
    """DeepSpeed's libaio probe (a C program calling io_submit, compiled and linked with -laio by the
    compiler Python was built with, or ``CC``, with ``CFLAGS`` and ``LDFLAGS``), keeping each step's command
    and the compiler's own error text, which ``has_function`` discards."""
    import importlib
    import shlex

    try:  # what DeepSpeed imports (Python 3.12 has no distutils of its own: setuptools provides it)
        ccompiler, dsys = (importlib.import_module(f"distutils.{m}") for m in ("ccompiler", "sysconfig"))
        compiler: Any = ccompiler.new_compiler()
        dsys.customize_compiler(compiler)
    except Exception as exc:  # the probe reports whatever stops it
        return {"outcome": f"distutils: {type(exc).__name__}: {exc}"}
    cflags = shlex.split(os.environ.get("CFLAGS", ""))
    ldflags = shlex.split(os.environ.get("LDFLAGS", ""))
    out: dict[str, Any] = {"python_cc": sysconfig.get_config_var("CC"), "CC": os.environ.get("CC", "")}
    with tempfile.TemporaryDirectory() as tmp:
        src, obj, exe = (str(Path(tmp) / name) for name in ("probe.c", "probe.o", "a.out"))
        Path(src).write_text("void io_submit(void); int main(int argc, char** argv) { io_submit(); return 0; }")
        steps = {
            "compile": [*compiler.compiler_so, *cflags, "-c", src, "-o", obj],
            "link": [*compiler.linker_exe, *ldflags, obj, "-laio", "-o", exe],
        }
        for step, cmd in steps.items():
            out[step] = " ".join(cmd)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                out["outcome"] = f"{step}: {type(exc).__name__}: {exc}"
                return out
            if proc.returncode:
                words = " | ".join(_failure_lines(proc.stderr + proc.stdout))
                out["outcome"] = f"{step} exit {proc.returncode}: {words}"
                return out
    out["outcome"] = "compiles and links here (DeepSpeed's probe failed for another reason)"
    return out


def _toolchain() -> dict[str, Any]:
    def first_line(cmd: list[str]) -> str:
        if shutil.which(cmd[0]) is None:
            return "absent"
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""

    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return {
        "python": sys.version.split()[0],
        "python_h": str(header) if header.exists() else f"absent: {header}",
        "cxx": first_line([os.environ.get("CXX", "c++"), "--version"]),
        "nvcc": first_line(["nvcc", "--version"]) if shutil.which("nvcc") else "absent",
        "ninja": first_line(["ninja", "--version"]),
        "cc": first_line([*os.environ.get("CC", str(sysconfig.get_config_var("CC") or "cc")).split(), "--version"]),
        "env": {
            k: os.environ.get(k, "") for k in ("CC", "CPATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "CFLAGS", "LDFLAGS")
        },
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("deepspeed", "torch", "pydantic", "pydantic-core", "hjson", "transformers", "torchao"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


def _failure_lines(log: str) -> list[str]:
    """The compiler's and the loader's own words: error lines first, else the last lines (no colour codes)."""
    import re

    log = re.sub(r"\x1b\[[0-9;]*m", "", log)  # DeepSpeed colours its warnings
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower() or "no such file" in ln.lower()]
    return (errors or lines)[-8:]


def _run_checks(aio_dir: str, timeout: float) -> dict[str, dict[str, Any]]:
    """Both op checks at once, each in its own session under ``timeout`` seconds in all."""
    procs, logs = {}, {}
    for op in ("cpu_adam", "async_io"):
        logs[op] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed with the process) files, not pipes: a verbose build never blocks on a full pipe
        cmd = [sys.executable, __file__, "--op", op, "--aio-dir", aio_dir]
        procs[op] = subprocess.Popen(cmd, stdout=logs[op], stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def stop(signum: int, frame: Any) -> None:  # killed from outside (the lane's timeout): take the builds along
        for p in procs.values():
            _kill_session(p.pid)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    results: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    for op, proc in procs.items():
        try:
            proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
            res = _parse(op, proc.returncode, logs[op])
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)  # the build's ninja and compilers too
            proc.wait()
            res = {"ok": False, "reason": f"{op} build did not finish in {timeout:g} s (killed)"}
        res["wall_s"] = time.perf_counter() - start
        results[op] = res
        logs[op].close()
    return results


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a check started with ``start_new_session``): ninja runs each
    compiler in a process group of its own, so killing the check's group would leave them running."""
    for _ in range(2):  # a second pass for what ninja started during the first
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getsid(int(entry.name)) == sid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue


def _parse(op: str, returncode: int, log_file: Any) -> dict[str, Any]:
    """The check's JSON (its last line); a failure's reason ends with the build's own error lines."""
    log_file.seek(0)
    lines = log_file.read().strip().splitlines()
    res: dict[str, Any] = {"ok": False}
    try:
        if lines:
            res = dict(json.loads(lines[-1]))
            lines = lines[:-1]
    except json.JSONDecodeError:
        res = {"ok": False}
    if not res.get("ok"):
        head = str(res.get("reason") or f"{op} failed (exit {returncode})")
        words = _failure_lines("\n".join(lines))
        res["reason"] = (head + (": " + " | ".join(words) if words else ""))[:700]
        res["log_tail"] = lines[-40:]
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the preflight record")
    parser.add_argument("--op", choices=["cpu_adam", "async_io"], help="run one check in this process")
    parser.add_argument("--aio-dir", default=tempfile.gettempdir(), help="where the aio check writes 16 MiB")
    parser.add_argument("--tag", default="", help="record name offload_peers_<tag>_deepspeed_preflight")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for both builds together")
    args = parser.parse_args()
    if args.op:
        try:
            res = _check_cpu_adam() if args.op == "cpu_adam" else _check_async_io(args.aio_dir)
        except Exception as exc:  # the build's own words are above in the log; this is the last line
            res = {"ok": False, "reason": f"{args.op}: {type(exc).__name__}: {str(exc)[:400]}"}
        print(json.dumps(res), flush=True)
        return
    if args.out is None:
        parser.error("--out is required without --op")
    metrics: dict[str, Any] = {"versions": _versions(), "toolchain": _toolchain()}
    if metrics["versions"]["deepspeed"] == "absent":
        metrics["ops"] = {op: {"ok": False, "reason": "not installed: deepspeed"} for op in ("cpu_adam", "async_io")}
    else:
        metrics["ops"] = _run_checks(args.aio_dir, args.timeout)
    metrics["op_rows"] = [  # the ops as a list, for the docs' rows blocks (docs/history/offload.md)
        {"op": op, "ok": r["ok"], "build_and_load_s": round(r.get("build_and_load_s", 0.0), 1),
         "reason": r.get("reason", "")[:300]}
        for op, r in metrics["ops"].items()
    ]  # fmt: skip
    write(metrics, args.out, tag=args.tag)
    print(json.dumps({op: (r["ok"], r.get("reason", "")[:300]) for op, r in metrics["ops"].items()}))


def write(metrics: dict[str, Any], out: Path, *, tag: str = "") -> Path:
    """One carina bench record (no figures: this run measures nothing; it says what can run)."""
    from carina.core.bench import make_record, write_record

    record = make_record(
        name=NAME.replace("peers_", f"peers_{tag}_") if tag else NAME,
        figures=[],
        config={"aio_dir": "scratch"},
        metrics=metrics,
        command=" ".join(["python", *sys.argv]),
    )
    return write_record(record, directory=out)


def load(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The ``ops`` and ``versions`` of a preflight record, or None when there is none."""
    if not path or not Path(path).exists():
        return None
    return dict(json.loads(Path(path).read_text())["metrics"])


if __name__ == "__main__":
    main()
