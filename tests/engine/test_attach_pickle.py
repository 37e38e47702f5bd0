"""A script that saves its DDP or model whole (`torch.save(ddp)`, `pickle.dumps`, `copy.deepcopy`) does so
attached as without ddpviz, and the copy trains to the same numbers. Reference: the same script in a process
without ddpviz. Before 2026-12-06 the attached save failed ("cannot pickle '_io.FileIO' object"): the DDP's
forward hooks, `_ddpviz_watch` and comm hook state reached ddpviz's open event file. Not covered: a save
inside a memory-traced step (steps 0-2, every 200th), whose phase hooks are local functions."""

from __future__ import annotations

from attach_process import EPILOGUE, PREAMBLE, plain_and_attached

SCRIPT = PREAMBLE + r'''
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):  # whole steps: saved between steps, as checkpoints are
    ddp(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
x = torch.ones(3, 4)
def saved(m):
    b = io.BytesIO()
    torch.save(m, b)
    b.seek(0)
    return torch.load(b, weights_only=False)

for how, save in (("torch.save", saved), ("pickle", lambda m: pickle.loads(pickle.dumps(m))), ("deepcopy", copy.deepcopy)):
    for what, m in (("ddp", ddp), ("model", ddp.module)):
        try:
            print(how, what, f"{save(m)(x).sum().item():.6f}")
        except Exception as exc:
            print(how, what, type(exc).__name__, exc)
''' + EPILOGUE


SAID = ("torch.save", "pickle", "deepcopy")  # the script's result lines


def test_a_ddp_or_model_saved_whole_is_saved_and_loads_as_without_ddpviz(tmp_path):
    plain, attached = plain_and_attached(tmp_path, SCRIPT, SAID)
    assert len(plain) == 6 and all(len(line.split(" ")) == 3 for line in plain), plain  # every save worked
    assert attached == plain
