"""Diagnostic (not committed): which live blocks make DP's CUDA floor exceed what outlives the run."""
import json, sys
import torch
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.modes.dp import cuda as dpc
from ddpviz.engine.run import run_training


def active(frames=True):
    out = []
    for seg in torch.cuda.memory_snapshot():
        if seg["device"] != 0:
            continue
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                fr = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in (b.get("frames") or [])
                      if f["filename"].endswith(".py")][:6]
                out.append(dict(addr=b.get("address"), size=b["size"], frames=fr))
    return out

if __name__ == "__main__":
    torch.cuda.memory._record_memory_history(max_entries=200000)
    snaps = {}
    orig = dpc.CudaDP._held_now

    def held_now(self, opt):
        got = orig(self, opt)
        snaps[len(snaps)] = dict(held=got, blocks=active())
        return got

    dpc.CudaDP._held_now = held_now
    big = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda:0"); del big
    sink = ListSink()
    cfg = RunConfig(mode="dp", world_size=1, device="cuda", width=64, depth=2, global_batch_size=32, steps=4, lr=0.1,
                    optimizer="sgd", eval_every=2, step_delay_s=0)
    r = run_training(cfg, sink, "diag")
    import gc; gc.collect()
    after = active()
    after_addr = {b["addr"] for b in after}
    mem = [dict((k, e.get(k)) for k in ("step", "held_at_start_bytes", "library_floor_bytes", "peak_allocated_bytes",
                                          "peak_training_bytes")) for e in sink.of_type("memory") if e.get("device") == "cuda:0"]
    rows = {k: [b for b in v["blocks"] if b["addr"] not in after_addr] for k, v in snaps.items()}
    out = dict(status=r.status, mem=mem, after_total=sum(b["size"] for b in after),
               gone_by_end={k: dict(total=sum(b["size"] for b in v), held=snaps[k]["held"], blocks=v) for k, v in rows.items()})
    json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
    print(json.dumps({k: (v["total"], v["held"]) for k, v in out["gone_by_end"].items()}, default=str), out["mem"])
