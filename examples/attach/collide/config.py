"""The script's own config module (named like many research repos name theirs)."""

CFG = dict(samples=192, batch_per_rank=16, width=32, lr=0.05, init_scale=1024.0, eval_batches=2, seed=0)
