"""Runs are the same experiment only on the same hardware (issue 20, item 2): a GPU run is never
validated against a CPU calibration, nor a gloo run against an NCCL one."""

from ddpviz.workers.scaleout import signature

CFG = {"model": "mlp", "width": 256, "global_batch_size": 96, "mode": "ddp", "world_size": 2,
       "device": "auto", "backend": "auto"}


def _rec(kind, name, backend="auto", **cfg):
    return {"config": {**CFG, "backend": backend, **cfg},
            "started": {"devices": [{"kind": kind, "name": name}], "backend": "gloo"}}


def test_the_same_config_on_other_hardware_is_another_experiment():
    cpu = _rec("cpu", "virtual CPU device 0 (host-a)")
    assert signature(cpu["config"], cpu) == signature(cpu["config"], _rec("cpu", "virtual CPU device 0 (host-a)",
                                                                           mode="dp", world_size=4))
    for other in (_rec("cuda", "NVIDIA H200"), _rec("cpu", "virtual CPU device 0 (host-b)"),
                  _rec("cpu", "virtual CPU device 0 (host-a)", backend="nccl")):
        assert signature(cpu["config"], cpu) != signature(other["config"], other)
    assert signature(_rec("cuda", "NVIDIA H200")["config"], _rec("cuda", "NVIDIA H200")) != \
        signature(_rec("cuda", "NVIDIA A100")["config"], _rec("cuda", "NVIDIA A100"))
