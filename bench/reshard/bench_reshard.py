"""The paper's resharding microbenchmarks (Zhuang et al. 2023, section 5.1), scaled down to this
machine: every layout pair runs under `mpirun` as one process per rank, the ranks spread in order
over emulated hosts whose network cards move one transfer at a time (oases-reshard --hosts N
--emulate-link). Each row gives, per strategy, the median measured time, the simulator's
prediction and its error, and the ratio to the lower bound (the bytes the busiest receiving card
must take in, over the link's bandwidth). Goals (issue 14): broadcast + load balancing >= 3x
faster than send/recv where receivers replicate the data, within 1.3x of the lower bound,
predictions within +-15%.
"""
import argparse
import json
import subprocess
import sys

# name, src mesh, src layout, dst mesh, dst layout, hosts (the source mesh's ranks first)
CASES = [
    ("S0RR->S0RR", "2x4", "S0RR", "2x4", "S0RR", 4),
    ("RRR->S0RR", "2x4", "RRR", "2x4", "S0RR", 4),
    ("RS0R->S0RR", "2x4", "RS0R", "2x4", "S0RR", 4),
    ("RS01R->S01RR", "2x4", "RS01R", "2x4", "S01RR", 4),
    ("S1RR->S0RR", "2x4", "S1RR", "2x4", "S0RR", 4),
    ("RS0R->RRS0", "2x4", "RS0R", "2x4", "RRS0", 4),
    ("2x4->3x4 S0RR", "2x4", "S0RR", "3x4", "S0RR", 5),
    ("1x4->2x4 RRR", "1x4", "RRR", "2x4", "RRR", 3),
    ("1->2x2 RRR", "1", "RRR", "2x2", "RRR", 3),
    ("1->4x2 RRR", "1", "RRR", "4x2", "RRR", 3),
]


def mesh_size(m):
    n = 1
    for x in m.split("x"):
        n *= int(x)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mib", type=float, default=64, help="tensor size in MiB (float32)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bw", type=float, default=1.25, help="inter-host GB/s (1.25 = 10 Gbit/s)")
    ap.add_argument("--latency", type=float, default=50, help="inter-host latency, us")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    elems = int(a.mib * 2**20 / 4)
    # a 3-D shape divisible by the meshes: [d0, 64, 16]
    d0 = max(48, elems // (64 * 16) // 48 * 48)
    shape = f"{d0},64,16"
    results = []
    print(f"tensor [{shape}] float32 = {d0 * 64 * 16 * 4 / 2**20:.1f} MiB; link {a.bw} GB/s, {a.latency} us between hosts; "
          f"median of {a.repeat} after a warm-up; one MPI process per rank")
    print(f"{'case':<16} {'ranks':>5} {'hosts':>5}  {'strategy':<10} {'measured_ms':>11} {'predicted_ms':>12} {'error':>7} "
          f"{'bound_ms':>9} {'x_bound':>7}  {'vs sendrecv':>11}")
    for name, sm, src, dm, dst, hosts in CASES:
        if a.only and a.only not in name:
            continue
        world = mesh_size(sm) + mesh_size(dm)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(world),
               f"{a.bin}/oases-reshard", "--shape", shape, "--src-mesh", sm, "--src", src, "--dst-mesh", dm, "--dst", dst,
               "--hosts", str(hosts), "--emulate-link", f"bw={a.bw},latency={a.latency}", "--compare", "--repeat", str(a.repeat), "-q"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{name}: failed (exit {p.returncode}): {p.stdout[-500:]} {p.stderr[-500:]}", file=sys.stderr)
            sys.exit(1)
        rows = {}
        for line in p.stdout.splitlines():
            f = line.split()
            if f and f[0] in ("sendrecv", "allgather", "broadcast"):
                rows[f[0]] = dict(measured_ms=float(f[1]), predicted_ms=float(f[2]), bound_ms=float(f[3]), exact=f[-1] == "bit-exact")
        base = rows["sendrecv"]["measured_ms"]
        for s, r in rows.items():
            err = (r["predicted_ms"] / r["measured_ms"] - 1) * 100
            xb = r["measured_ms"] / r["bound_ms"] if r["bound_ms"] > 0 else float("nan")
            print(f"{name:<16} {world:>5} {hosts:>5}  {s:<10} {r['measured_ms']:>11.1f} {r['predicted_ms']:>12.1f} {err:>+6.1f}% "
                  f"{r['bound_ms']:>9.1f} {xb:>7.2f}  {base / r['measured_ms']:>10.2f}x{'' if r['exact'] else '  MISMATCH'}")
            results.append(dict(case=name, ranks=world, hosts=hosts, strategy=s, **r))
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        import os
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
