"""The batch plan is PyTorch's DistributedSampler, and every mode sees the same global batch."""

import torch
from torch.utils.data.distributed import DistributedSampler

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, load_dataset


def test_digits_are_the_real_scikit_learn_digits():
    ds = load_dataset(RunConfig())
    assert len(ds) + len(ds.x_val) == 1797
    assert ds.x_train.shape[1] == 64 and 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert set(ds.y_train.unique().tolist()) == set(range(10))


def test_text_is_character_level_prose_with_shifted_targets():
    ds = load_dataset(RunConfig(model="gpt", dataset="text", block_size=32))
    assert ds.x_train.shape[1] == 32
    assert torch.equal(ds.x_train[0, 1:], ds.y_train[0, :-1])
    assert 60 < ds.n_classes < 200  # printable characters of English prose


def test_rank_shards_match_distributed_sampler_and_do_not_overlap():
    plan = BatchPlan(n_samples=1000, world_size=3, micro_batch=8, seed=7)
    for rank in range(3):
        s = DistributedSampler(range(1000), num_replicas=3, rank=rank, shuffle=True, seed=7, drop_last=True)
        s.set_epoch(0)
        assert plan.rank_indices(0, rank).tolist() == list(s)[:8]
        assert plan.rank_indices(2, rank).tolist() == list(s)[16:24]
    shards = [set(plan.rank_indices(0, r).tolist()) for r in range(3)]
    assert not (shards[0] & shards[1] or shards[1] & shards[2])


def test_global_batch_is_the_ranks_shards_in_rank_order_and_epochs_reshuffle():
    plan = BatchPlan(n_samples=100, world_size=2, micro_batch=10, seed=0)
    g = plan.global_indices(0)
    assert g[:10].tolist() == plan.rank_indices(0, 0).tolist()
    assert g[10:].tolist() == plan.rank_indices(0, 1).tolist()
    assert plan.batches_per_epoch == 5
    assert plan.rank_indices(5, 0).tolist() != plan.rank_indices(0, 0).tolist()  # epoch 1


def test_digits_are_exactly_what_scikit_learn_loads():
    from sklearn.datasets import load_digits

    from ddpviz.engine.data import _digits_arrays

    x, y = _digits_arrays()
    ref = load_digits()
    assert x.shape == (1797, 64) and y.shape == (1797,)
    assert torch.equal(x, torch.tensor(ref.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.tensor(ref.target, dtype=torch.long))
