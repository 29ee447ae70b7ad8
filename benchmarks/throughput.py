"""Throughput, CPU per item, HTTP, memory and import time, side by side with async-batch-llm 0.28.

    python benchmarks/throughput.py [--sections latency,cpu,http,memory,import] [--items 10000]
                                    [--workers 100] [--repeat 5] [--http-items 3000] [--quick]
                                    [--http-pool-counts]

1. latency: 10,000 items, 100 workers, 5 ms fake latency: items/s (ceiling 20,000/s).
2. cpu: the same at zero latency: µs of process CPU per item.
   Both run our engine (process_all and process_prompts) and the bare anyio pool
   (from overhead.py) on trio, asyncio and uvloop, and async-batch-llm on asyncio.
3. http: the mock server (separate process) at concurrency 200: ours
   (OpenAICompatibleStrategy), async-batch-llm's OpenAI-compatible path (the
   openai SDK via ``llm("openai-compatible:...")``), and a raw httpx2 loop.
   ``--http-pool-counts`` adds connections opened per run and idle-connection
   probes per request (``PoolCounts``).
4. memory: 100,000 and 1,000,000 items through process_stream with bounded
   queues, one fresh process per size: peak RSS growth.
6. import: ``import trio_batch_llm`` vs ``import anyio`` (and async-batch-llm).
(5, store throughput, is benchmarks/store_throughput.py.)

Repetitions are interleaved (every variant once per round) and medians reported.
Writes benchmarks/results/throughput.json and throughput_*.png.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import Any

from _common import (
    BACKENDS,
    measure,
    median,
    ratio,
    run_native_asyncio,
    run_on,
    table,
    use_quick_results,
    uvloop_available,
    write_json,
)
from overhead import bare_pool, ours_process_all, ours_process_prompts

SECTIONS = ("latency", "cpu", "http", "memory", "import")


def _fake_variants(backends: list[str], abl: bool) -> dict[str, Callable[[int, int, float], int]]:
    variants: dict[str, Callable[[int, int, float], int]] = {}
    for backend in backends:
        variants[f"bare anyio pool ({backend})"] = (
            lambda n, w, lat, b=backend: run_on(b, bare_pool, n, w, lat, False))
        variants[f"ours process_all ({backend})"] = lambda n, w, lat, b=backend: run_on(b, ours_process_all, n, w, lat)
        variants[f"ours process_prompts ({backend})"] = (
            lambda n, w, lat, b=backend: run_on(b, ours_process_prompts, n, w, lat))
    if abl:
        import _throughput_abl as abl_mod

        variants["async-batch-llm process_all (asyncio)"] = (
            lambda n, w, lat: run_native_asyncio(abl_mod.abl_process_all, n, w, lat))
        variants["async-batch-llm process_prompts (asyncio)"] = (
            lambda n, w, lat: run_native_asyncio(abl_mod.abl_process_prompts, n, w, lat))
    return variants


def fake_workloads(args: argparse.Namespace, latency: float) -> list[dict[str, Any]]:
    variants = _fake_variants(args.backends, args.abl)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, fn in variants.items():
            gc.collect()
            wall, cpu, done = measure(lambda fn=fn: fn(args.items, args.workers, latency))
            assert done == args.items, (name, done)
            runs[name].append((wall, cpu))
    records = []
    for name, samples in runs.items():
        wall = median([w for w, _ in samples])
        cpu = median([c for _, c in samples])
        records.append({"variant": name, "latency_s": latency, "items": args.items, "workers": args.workers,
                        "items_per_s": args.items / wall, "cpu_us_per_item": cpu / args.items * 1e6,
                        "repeat": len(samples)})
    return records


def _backend_of(name: str) -> str:
    return name.rsplit("(", 1)[-1].rstrip(")")


def fake_rows(records: list[dict[str, Any]], metric: str) -> list[list[Any]]:
    by_name = {r["variant"]: r for r in records}
    abl = {kind: by_name.get(f"async-batch-llm {kind} (asyncio)") for kind in ("process_all", "process_prompts")}
    rows = []
    for r in records:
        bare = by_name.get(f"bare anyio pool ({_backend_of(r['variant'])})")
        kind = "process_all" if "process_all" in r["variant"] else "process_prompts"
        twin = abl[kind] if r["variant"].startswith("ours") else None
        value = r[metric]
        vs_bare = ratio(value, bare[metric]) if bare else float("nan")
        vs_abl = ratio(value, twin[metric]) if twin else float("nan")
        if metric == "items_per_s":
            r["vs_bare"], r["vs_abl"] = vs_bare, vs_abl
        else:
            r["cpu_vs_bare"], r["cpu_vs_abl"] = vs_bare, vs_abl
        rows.append([r["variant"], value, f"{vs_bare:.2f}x", f"{vs_abl:.2f}x" if twin else "-"])
    return rows


class PoolCounts:
    """``--http-pool-counts``: connections httpcore2 opens, and its idle-connection probes, in this process.

    httpcore2's pool calls ``has_expired()`` on every connection that is idle and
    not reserved for a request, on every pass (two passes per request); on an idle
    connection that probes its socket. So probes per request measure how many
    connections sit idle between a response and the next request (the HTTP gap
    in docs/benchmarks.md). Wrapping costs a little time: off by default.
    async-batch-llm's openai SDK uses httpcore, not httpcore2: it counts zero.
    """

    def __init__(self) -> None:
        from httpcore2._async import connection_pool, http11

        self.opened = self.probes = 0
        create, expired = connection_pool.AsyncConnectionPool.create_connection, http11.AsyncHTTP11Connection.has_expired

        def counting_create(pool: Any, origin: Any) -> Any:
            self.opened += 1
            return create(pool, origin)

        def counting_expired(connection: Any) -> bool:
            self.probes += 1
            return expired(connection)

        connection_pool.AsyncConnectionPool.create_connection = counting_create  # type: ignore[method-assign]
        http11.AsyncHTTP11Connection.has_expired = counting_expired  # type: ignore[method-assign]

    def take(self) -> tuple[int, int]:
        """(connections opened, probes) since the last call."""
        counts, self.opened, self.probes = (self.opened, self.probes), 0, 0
        return counts


def http_workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    import _throughput_http as h
    from _mock_process import MockServerProcess

    pool_counts = PoolCounts() if args.http_pool_counts else None
    counted: dict[str, list[tuple[int, int]]] = {}
    with MockServerProcess() as server:
        variants: dict[str, Callable[[], int]] = {}
        for backend in args.backends:
            variants[f"raw httpx2 loop ({backend})"] = (
                lambda b=backend: run_on(b, h.raw_httpx2, args.http_items, args.concurrency, server.base_url))
            variants[f"ours OpenAICompatibleStrategy ({backend})"] = (
                lambda b=backend: run_on(b, h.ours_http, args.http_items, args.concurrency, server.base_url))
        if args.abl:
            import _throughput_abl as abl_mod

            variants["async-batch-llm openai-compatible (asyncio)"] = (
                lambda: run_native_asyncio(abl_mod.abl_http, args.http_items, args.concurrency, server.base_url))
        runs: dict[str, list[float]] = {name: [] for name in variants}
        succeeded: dict[str, list[int]] = {name: [] for name in variants}
        for _ in range(args.http_repeat):
            for name, fn in variants.items():
                gc.collect()
                if pool_counts is not None:
                    pool_counts.take()
                wall, _, done = measure(fn)
                runs[name].append(wall)
                if pool_counts is not None:
                    counted.setdefault(name, []).append(pool_counts.take())
                succeeded[name].append(done)  # reported, not asserted: one bad run must not lose the rest
    records = [{"variant": name, "items": args.http_items, "concurrency": args.concurrency,
                "items_per_s": args.http_items / median(walls), "repeat": len(walls),
                "min_succeeded": min(succeeded[name])} for name, walls in runs.items()]
    for r in records:
        if r["variant"] in counted:
            samples = counted[r["variant"]]
            r["connections_opened"] = max(opened for opened, _ in samples)
            r["idle_probes_per_request"] = median([probes / args.http_items for _, probes in samples])
    for r in records:
        if r["min_succeeded"] != r["items"]:
            print(f"WARNING {r['variant']}: only {r['min_succeeded']} of {r['items']} requests succeeded")
    by_name = {r["variant"]: r for r in records}
    abl = by_name.get("async-batch-llm openai-compatible (asyncio)")
    for r in records:
        raw = by_name.get(f"raw httpx2 loop ({_backend_of(r['variant'])})")
        r["vs_raw"] = ratio(r["items_per_s"], raw["items_per_s"]) if raw else float("nan")
        r["vs_abl"] = ratio(r["items_per_s"], abl["items_per_s"]) if abl else float("nan")
    return records


def memory_workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    from _footprint import memory_in_subprocess

    records = []
    for backend in args.memory_backends:
        for items in args.memory_sizes:
            records.append(memory_in_subprocess(items, backend))
    return records


def import_workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    from _footprint import import_time_us

    modules = ["anyio", "trio_batch_llm"] + (["async_batch_llm"] if args.abl else [])
    return [import_time_us(m, runs=args.import_runs) for m in modules]


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in result.get("latency", []):
        if r["variant"].startswith("ours"):
            out.append({"goal": f"{r['variant']} >= 90% of bare pool items/s", "value": r["vs_bare"],
                        "met": r["vs_bare"] >= 0.9})
            if r["variant"].endswith("(asyncio)") and r["vs_abl"] == r["vs_abl"]:
                out.append({"goal": f"{r['variant']} >= 3.5x async-batch-llm", "value": r["vs_abl"],
                            "met": r["vs_abl"] >= 3.5})
    for r in result.get("cpu", []):
        if r["variant"].startswith("ours"):
            out.append({"goal": f"{r['variant']} CPU/item <= 2x bare pool", "value": r["cpu_vs_bare"],
                        "met": r["cpu_vs_bare"] <= 2.0})
    for r in result.get("http", []):
        if r["variant"].startswith("ours"):
            out.append({"goal": f"{r['variant']} >= 80% of raw httpx2", "value": r["vs_raw"], "met": r["vs_raw"] >= 0.8})
            if r["vs_abl"] == r["vs_abl"]:
                out.append({"goal": f"{r['variant']} >= async-batch-llm", "value": r["vs_abl"],
                            "met": r["vs_abl"] >= 1.0})
    for r in result.get("memory", []):
        if r["items"] >= 1_000_000:
            out.append({"goal": f"peak RSS growth, 1M items ({r['backend']}) <= 10 MiB",
                        "value": r["peak_growth_mib"], "met": r["peak_growth_mib"] <= 10})
    return out


def render(result: dict[str, Any]) -> str:
    out = []
    if "latency" in result:
        out.append(f"1. {result['latency'][0]['items']:,} items, {result['latency'][0]['workers']} workers, "
                   f"5 ms latency (ceiling {result['latency'][0]['workers'] / 0.005:,.0f}/s)\n" + table(
                       ["variant", "items/s", "vs bare", "vs ABL"], fake_rows(result["latency"], "items_per_s")))
    if "cpu" in result:
        out.append("2. zero latency: CPU per item\n" + table(
            ["variant", "CPU µs/item", "vs bare", "vs ABL"], fake_rows(result["cpu"], "cpu_us_per_item")))
    if "http" in result:
        counts = "connections_opened" in result["http"][0]
        out.append(f"3. mock server over HTTP, concurrency {result['http'][0]['concurrency']}\n" + table(
            ["variant", "items/s", "vs raw", "vs ABL"] + (["conns opened (max/run)", "idle probes/req"] if counts else []),
            [[r["variant"], r["items_per_s"], f"{r['vs_raw']:.2f}x", f"{r['vs_abl']:.2f}x"]
             + ([r.get("connections_opened", "-"), r.get("idle_probes_per_request", "-")] if counts else [])
             for r in result["http"]]))
    if "memory" in result:
        rows = result["memory"]
        out.append("4. process_stream, bounded queues, zero latency, fresh process per size\n" + table(
            ["backend", "items", "peak RSS before MiB", "peak RSS after MiB", "growth MiB", "items/s"],
            [[r["backend"], r["items"], r["peak_rss_before_mib"], r["peak_rss_after_mib"], r["peak_growth_mib"],
              r["items_per_s"]] for r in rows]))
    if "import" in result:
        out.append("6. import time (median cumulative, -X importtime)\n" + table(
            ["module", "ms", "also imported"],
            [[r["module"], r["median_us"] / 1000, r["also_imported"]] for r in result["import"]]))
    if result.get("goals"):
        out.append("goals\n" + table(["goal", "value", "met"], [
            [g["goal"], f"{g['value']:.2f}", "yes" if g["met"] else "NO"] for g in result["goals"]]))
    return "\n\n".join(out)


def plots(result: dict[str, Any]) -> list[str]:
    from _plots import plot_bars

    paths = []
    if "latency" in result:
        rows = result["latency"]
        paths.append(plot_bars("10,000 items, 100 workers, 5 ms latency", [r["variant"] for r in rows],
                               [r["items_per_s"] for r in rows], "items/s", "throughput_latency.png",
                               reference=("ceiling 20,000/s", rows[0]["workers"] / 0.005)))
    if "cpu" in result:
        rows = result["cpu"]
        paths.append(plot_bars("zero latency: CPU per item", [r["variant"] for r in rows],
                               [r["cpu_us_per_item"] for r in rows], "µs of CPU per item", "throughput_cpu.png"))
    if "http" in result:
        rows = result["http"]
        paths.append(plot_bars(f"mock server over HTTP, concurrency {rows[0]['concurrency']}",
                               [r["variant"] for r in rows], [r["items_per_s"] for r in rows], "requests/s",
                               "throughput_http.png"))
    return [str(p) for p in paths]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--http-items", type=int, default=3_000)
    parser.add_argument("--http-repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--http-pool-counts", action="store_true",
                        help="count connections opened and idle-connection probes per request (see PoolCounts)")
    parser.add_argument("--memory-sizes", default="100000,1000000")
    parser.add_argument("--memory-backends", default="trio,asyncio")
    parser.add_argument("--import-runs", type=int, default=7)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--no-abl", dest="abl", action="store_false")
    parser.add_argument("--no-plot", dest="plot", action="store_false")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, one repetition")
    args = parser.parse_args(argv)
    if args.quick:
        use_quick_results()  # a smoke run never overwrites the published figures
        args.items, args.repeat, args.http_items, args.http_repeat = 1_000, 1, 400, 1
        args.memory_sizes, args.memory_backends, args.import_runs = "10000,50000", "trio", 3
    args.sections = args.sections.split(",")
    args.backends = [b for b in args.backends.split(",") if b != "uvloop" or uvloop_available()]
    args.memory_sizes = [int(x) for x in args.memory_sizes.split(",")]
    args.memory_backends = args.memory_backends.split(",")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    result: dict[str, Any] = {}
    if "latency" in args.sections:
        result["latency"] = fake_workloads(args, 0.005)
        fake_rows(result["latency"], "items_per_s")  # fills in the ratios
    if "cpu" in args.sections:
        result["cpu"] = fake_workloads(args, 0.0)
        fake_rows(result["cpu"], "cpu_us_per_item")
    if "http" in args.sections:
        result["http"] = http_workload(args)
    if "memory" in args.sections:
        result["memory"] = memory_workload(args)
        sizes = {r["items"] for r in result["memory"]}
        if len(sizes) >= 2:
            small, big = min(sizes), max(sizes)
            for backend in args.memory_backends:
                rs = {r["items"]: r for r in result["memory"] if r["backend"] == backend}
                if small in rs and big in rs:
                    result.setdefault("memory_ratio", {})[backend] = ratio(
                        rs[big]["peak_rss_after_mib"], rs[small]["peak_rss_after_mib"])
    if "import" in args.sections:
        result["import"] = import_workload(args)
    result["goals"] = goals(result)
    text = render(result)
    print(text)
    if "memory_ratio" in result:
        print("\npeak RSS, largest vs smallest size: "
              + ", ".join(f"{b} {v:.3f}x" for b, v in result["memory_ratio"].items()))
    path = write_json("throughput", {"args": {k: v for k, v in vars(args).items()}, **result})
    print(f"\nwrote {path}")
    if args.plot:
        for p in plots(result):
            print(f"wrote {p}")
    return result


if __name__ == "__main__":
    main()
