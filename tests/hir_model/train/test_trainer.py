"""Trainer: EMA teacher, non-finite stop, resume after a kill, warm start, 2-process gloo DDP vs one process."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hir_model.train.checkpoint import load_checkpoint, load_trained_model
from hir_model.graph.types import NODE_TYPES
from hir_model.nn import collate
from hir_model.train.data import seed_only, step_batch, view_of
from hir_model.train.model import HIRModel, ema_update, make_teacher
from hir_model.train.trainer import NonFiniteLoss, embed_nodes, seed_prototypes, train_window
from hir_model.train.config import TrainConfig, set_fields
from tests.hir_model.train.tiny import tiny_config, tiny_data


def test_teacher_gets_no_gradient_and_follows_the_student_by_ema():
    cfg = tiny_config()
    student = HIRModel(cfg)
    teacher = make_teacher(student)
    assert all(not p.requires_grad for p in teacher.parameters())
    data, _ = tiny_data()
    from hir_model.nn import collate
    batch = collate(view_of(data, data.active[:4], cfg, 0))
    (student(batch)[0].sum() + teacher(batch)[0].sum()).backward()
    assert all(p.grad is None for p in teacher.parameters())
    before = [p.clone() for p in teacher.parameters()]
    with torch.no_grad():
        for p in student.parameters():
            p.add_(1.0)
    ema_update(teacher, student, 0.9)
    for b, t, s in zip(before, teacher.parameters(), student.parameters()):
        torch.testing.assert_close(t, 0.9 * b + 0.1 * s)


def test_non_finite_loss_raises():
    data, _ = tiny_data()
    with pytest.raises(NonFiniteLoss, match="non-finite loss"):
        train_window(data, tiny_config(lr=float("inf"), steps=3, warmup_steps=1))


def test_training_reports_metrics_and_the_checkpoint_reproduces_the_probe(tmp_path):
    data, _ = tiny_data()
    cfg = tiny_config()
    r = train_window(data, cfg, tmp_path / "c.pt", window="w0")
    assert r.window_steps == cfg.budget.steps and len(r.losses) == cfg.budget.steps and np.isfinite(r.losses).all()
    assert len(r.usage_entropy) == len(cfg.prototypes.levels) and r.backend == "dense" and r.samples_per_s > 0
    model = load_trained_model(tmp_path / "c.pt")
    assert model.levels == cfg.prototypes.levels and model.global_levels == cfg.prototypes.global_levels and model.window == "w0"
    again = embed_nodes(model.encoder, model.global_tokens, data, np.array(r.probe_nodes), cfg)
    torch.testing.assert_close(again, torch.tensor(r.probe_embeddings), atol=1e-5, rtol=1e-5)


def test_kill_and_resume_reaches_the_same_final_step_and_weights(tmp_path):
    data, _ = tiny_data()
    cfg = tiny_config(steps=4, checkpoint_every=2)
    full = train_window(data, cfg, tmp_path / "full.pt", window="w0")
    killed = train_window(data, cfg, tmp_path / "k.pt", window="w0", stop_after=2)  # "killed" after 2 steps
    assert killed.window_steps == 2 and not load_checkpoint(tmp_path / "k.pt")["extra"]["complete"]
    resumed = train_window(data, cfg, tmp_path / "k.pt", window="w0")
    assert resumed.resumed_from == 2 and resumed.window_steps == cfg.budget.steps == full.window_steps
    assert resumed.weights_digest == full.weights_digest or torch.allclose(
        torch.tensor(resumed.probe_embeddings), torch.tensor(full.probe_embeddings), atol=1e-5)
    assert load_checkpoint(tmp_path / "k.pt")["extra"]["complete"]


def test_warm_start_continues_the_step_count(tmp_path):
    data, _ = tiny_data()
    cfg = tiny_config(steps=2)
    first = train_window(data, cfg, tmp_path / "a.pt", window="w0")
    second = train_window(data, cfg, tmp_path / "b.pt", init=tmp_path / "a.pt", window="w1")
    assert second.warm_started and second.step == first.step + cfg.budget.steps
    payload = load_checkpoint(tmp_path / "b.pt")
    assert payload["step"] == 4 and payload["window"] == "w1"


def _ddp_worker(rank: int, world: int, init_file: str, out: str, queue) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    data, _ = tiny_data()
    r = train_window(data, tiny_config(steps=3, shards=world), Path(out) if rank == 0 else None, window="w0")
    queue.put((rank, r.weights_digest, r.losses))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_process_gloo_ddp_matches_one_process(tmp_path):
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    torch.multiprocessing.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "ddp.pt"), queue), nprocs=2)
    got = dict((rank, (digest, losses)) for rank, digest, losses in (queue.get() for _ in range(2)))
    assert got[0][0] == got[1][0]  # identical weights on both ranks
    data, _ = tiny_data()
    single = train_window(data, tiny_config(steps=3, shards=2), tmp_path / "one.pt", window="w0")
    np.testing.assert_allclose(single.losses, got[0][1], rtol=1e-4, atol=1e-5)
    a, b = load_checkpoint(tmp_path / "ddp.pt"), load_checkpoint(tmp_path / "one.pt")
    for k, v in a["extra"]["student"].items():
        w = b["extra"]["student"][k]
        if k.endswith("attn.qkv.bias"):
            # the key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by every key), so
            # Adam turns the two runs' different float round-off there into +-lr steps: compare query/value only
            width = len(v) // 3
            v, w = torch.cat([v[:width], v[2 * width:]]), torch.cat([w[:width], w[2 * width:]])
        torch.testing.assert_close(v, w, atol=1e-4, rtol=1e-3)


def test_seed_only_cuts_flagged_sequences_to_their_seed_token():
    data, _ = tiny_data()
    cfg = tiny_config()
    batch = view_of(data, data.active[:6], cfg, seed=1)
    assert (batch.lengths > 1).all()
    which = np.array([True, False, True, False, False, True])
    cut = seed_only(batch, which)
    np.testing.assert_array_equal(cut.seeds, batch.seeds)
    np.testing.assert_array_equal(cut.lengths, np.where(which, 1, batch.lengths))
    for s in np.flatnonzero(~which):  # untouched sequences: every token array the same
        a, b = slice(batch.offsets[s], batch.offsets[s + 1]), slice(cut.offsets[s], cut.offsets[s + 1])
        for f in ("node", "depth", "ancestors", "edge_type", "edge_age", "token_codes", "strength"):
            np.testing.assert_array_equal(getattr(cut, f)[b], getattr(batch, f)[a])
    assert (cut.node[cut.offsets[:-1][which]] == batch.seeds[which]).all() and (cut.depth[cut.offsets[:-1][which]] == 0).all()
    assert (batch.strength[batch.offsets[:-1][which]] > 0).all() and (cut.strength[cut.offsets[:-1][which]] == 0).all()  # as if new
    z = HIRModel(cfg).encoder(collate(cut))  # the encoder takes a one-token sequence
    assert torch.isfinite(z).all()


def test_cold_share_draws_seed_only_views_of_entities_never_of_users():
    data, _ = tiny_data()
    types = np.asarray(data.graph.nodes.node_type)
    user = NODE_TYPES.index("user")
    warm = step_batch(data, tiny_config(cold_share=0.0, batch_size=64), 0, 0)
    cold = step_batch(data, tiny_config(cold_share=1.0, batch_size=64), 0, 0)
    np.testing.assert_array_equal(warm.narrow.seeds, cold.narrow.seeds)
    is_user = types[cold.narrow.seeds] == user
    assert (cold.narrow.lengths[~is_user] == 1).all() and (warm.narrow.lengths[~is_user] > 1).any()
    np.testing.assert_array_equal(cold.narrow.lengths[is_user], warm.narrow.lengths[is_user])
    np.testing.assert_array_equal(cold.broad.lengths, warm.broad.lengths)  # the teacher keeps the history


def test_a_warm_start_moves_prototypes_to_the_centroids_of_the_teachers_embeddings():
    data, _ = tiny_data()
    # without global tokens: with them, refined coarse prototypes also move the embeddings (the next test's guard)
    cfg = tiny_config(refine_iters=20, global_tokens=False)
    student = HIRModel(cfg)
    teacher = make_teacher(student)
    nodes = data.active

    def fit() -> list[float]:  # per level: mean cosine of a node to its nearest prototype
        z = embed_nodes(teacher, teacher.global_tokens(), data, nodes, cfg)
        return [float((z @ p.T).max(1).values.mean()) for p in teacher.normalised_prototypes()]

    before = fit()
    seed_prototypes(student, teacher, data, cfg, fresh=False)
    for s, t in zip(student.prototypes, teacher.prototypes):
        torch.testing.assert_close(s, t)
    after = fit()
    assert all(a > b + 0.05 for a, b in zip(after, before)), (before, after)  # random prototypes -> centroids
    kept = [p.detach().clone() for p in teacher.prototypes]
    seed_prototypes(student, teacher, data, tiny_config(refine_iters=0, global_tokens=False), fresh=False)  # off: nothing moves
    for p, q in zip(teacher.prototypes, kept):
        torch.testing.assert_close(p, q)


def test_a_warm_start_keeps_its_prototypes_when_the_refined_ones_would_collapse_the_assignments(monkeypatch, caplog):
    """Refined coarse prototypes are also the encoder's global tokens; refined prototypes that, fed back, put every
    node on one prototype are refused (a late MovieLens window ended collapsed that way)."""
    import hir_model.train.prototypes as prototypes

    data, _ = tiny_data()
    cfg = tiny_config(refine_iters=20)
    torch.manual_seed(0)  # a fresh start whose coarse level is not already on one prototype (the guard compares with it)
    student = HIRModel(cfg)
    teacher = make_teacher(student)
    seed_prototypes(student, teacher, data, cfg, fresh=True)  # a fresh model's start: k-means of the embeddings
    kept = [p.detach().clone() for p in teacher.prototypes]
    # a degenerate refinement: every prototype of a level on one point, so every node's argmax is the first
    monkeypatch.setattr(prototypes, "primitive_centroids", lambda z, p, *a, **k: np.tile(p[:1], (len(p), 1)))
    with caplog.at_level("WARNING", logger=prototypes.log.name):
        seed_prototypes(student, teacher, data, cfg, fresh=False)
    assert "would collapse" in caplog.text
    for m in (student, teacher):
        for p, q in zip(m.prototypes, kept):
            torch.testing.assert_close(p, q)


def test_a_fresh_readout_is_centred_per_node_type():
    """Each seed type's mean readout is subtracted (one shared mean let the coarse level split users from products)."""
    from hir_model.train.trainer import PROBE_SEED, centre_inputs_and_readout, sample_active
    data, _ = tiny_data()
    cfg = tiny_config()
    student = HIRModel(cfg)
    teacher = make_teacher(student)
    nodes = sample_active(data, cfg, PROBE_SEED + 4, cfg.runtime.metric_nodes)
    types = data.graph.nodes.node_type[nodes]
    assert len(np.unique(types)) >= 2
    raw = embed_nodes(teacher, teacher.global_tokens(), data, nodes, cfg, seed=PROBE_SEED + 4, readout=True)
    assert max(float(raw[types == t].mean(0).norm()) for t in np.unique(types)) > 0.1
    centre_inputs_and_readout(student, teacher, data, cfg)
    h = embed_nodes(teacher, teacher.global_tokens(), data, nodes, cfg, seed=PROBE_SEED + 4, readout=True)
    for t in np.unique(types):
        assert float(h[types == t].mean(0).norm()) < 1e-4 * float(h[types == t].norm(dim=1).mean()), NODE_TYPES[t]
    torch.testing.assert_close(student.encoder.out_mean, teacher.encoder.out_mean)


def test_without_centre_users_the_user_readout_keeps_its_mean(tmp_path):
    """centre_users=False: every other seed type is centred, users keep the direction they share (where a popularity
    preference lives)."""
    from hir_model.train.trainer import centre_inputs_and_readout
    data, _ = tiny_data()
    from hir_model.train.config import with_overrides
    # the popularity settings (README, Training): strength token, logQ correction (both on for MovieLens), the users' mean kept
    cfg = with_overrides(tiny_config(centre_users=False, logq_correction=True), {"encoder": {"strength_buckets": 24}})
    batch = step_batch(data, cfg, 0, 0)
    assert batch.log_q.shape == (2, batch.pairs) and np.isfinite(batch.log_q).all()
    student = HIRModel(cfg)
    teacher = make_teacher(student)
    centre_inputs_and_readout(student, teacher, data, cfg)
    out_mean = teacher.encoder.out_mean
    assert float(out_mean[NODE_TYPES.index("user")].norm()) == 0 and float(out_mean[NODE_TYPES.index("product")].norm()) > 0.1
    result = train_window(data, cfg, out=tmp_path / "w.pt")  # and so it stays while training re-centres the others
    assert np.isfinite(result.parts["engagement"]).all()
    trained = load_trained_model(tmp_path / "w.pt").encoder.out_mean
    assert float(trained[NODE_TYPES.index("user")].norm()) == 0 and float(trained[NODE_TYPES.index("product")].norm()) > 0.1


def test_an_encoder_saved_with_one_shared_readout_mean_still_loads():
    cfg = tiny_config()
    encoder = HIRModel(cfg).encoder
    state = encoder.state_dict()
    shared = torch.randn(encoder.cfg.width)
    state["out_mean"] = shared  # the format before the per-type centre
    encoder.load_state_dict(state)
    torch.testing.assert_close(encoder.out_mean, shared.expand(len(NODE_TYPES), -1))



def test_the_swap_term_trains_when_weighted():
    data, _ = tiny_data()
    off, on = (train_window(data, tiny_config(steps=3, swap_weight=w)) for w in (0.0, 1.0))
    assert np.isfinite(on.losses).all() and on.weights_digest != off.weights_digest
    assert "swap" not in off.parts and len(on.parts["swap"]) == 3 and all(v > 0 for v in on.parts["swap"])  # its own curve


def test_training_is_reproducible_on_two_threads():
    # the default encoder on a few hundred nodes: with 2 threads a backward kernel's parallel sums made two runs
    # differ (three runs, three digests) until training ran with torch's deterministic algorithms
    data, _ = tiny_data(groups=8, users=20, products=20)
    cfg = set_fields(TrainConfig(), levels=(2, 4), steps=4, warmup_steps=1, checkpoint_every=0, probe_size=4, metric_nodes=64)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        digests = {train_window(data, cfg).weights_digest for _ in range(3)}
    finally:
        torch.set_num_threads(threads)
    assert len(digests) == 1
    assert not torch.are_deterministic_algorithms_enabled()  # the setting is the caller's again afterwards


def test_a_structural_encoding_reaches_every_view_and_the_checkpoint_still_reproduces_the_probe(tmp_path):
    from hir_model.train.config import with_overrides
    data, _ = tiny_data()
    cfg = with_overrides(tiny_config(), {"encoder": {"structure_dim": 8}})
    batch = step_batch(data, cfg, 0, 0)
    for view in (batch.narrow, batch.broad):  # the graph's encodings, token by token
        np.testing.assert_array_equal(view.structure, data.graph.structure_at(view.node, data.cutoff_us, 8))
    cut = seed_only(batch.broad, np.ones(batch.broad.num_sequences, bool))
    assert cut.structure.shape == (cut.num_sequences, 8) and not cut.structure.any()  # as if new: no place in the graph
    r = train_window(data, cfg, tmp_path / "s.pt", window="w0")
    assert np.isfinite(r.losses).all()
    model = load_trained_model(tmp_path / "s.pt")
    assert model.encoder.cfg.structure_dim == 8
    saved = TrainConfig.from_dict(load_checkpoint(tmp_path / "s.pt")["extra"]["train_config"])  # what the asset's check reloads
    again = embed_nodes(model.encoder, model.global_tokens, data, np.array(r.probe_nodes), saved)
    torch.testing.assert_close(again, torch.tensor(r.probe_embeddings), atol=1e-5, rtol=1e-5)
    blind = embed_nodes(model.encoder, model.global_tokens, data, np.array(r.probe_nodes), tiny_config())  # without them
    assert not torch.allclose(blind, again, atol=1e-3)


@pytest.mark.parametrize("transport", ["shm", "pipe"])
def test_worker_processes_train_the_same_weights_as_the_background_thread(transport, monkeypatch):
    from hir_model.train import loader
    monkeypatch.setattr(loader, "SHM_NEEDED", 0 if transport == "shm" else 2**62)
    data, _ = tiny_data()
    cfg = tiny_config(checkpoint_every=0)
    thread = train_window(data, cfg)
    procs = train_window(data, set_fields(cfg, loader_workers=2))
    assert thread.loader == "thread" and procs.loader == f"2 processes, lean, {transport}"
    assert procs.weights_digest == thread.weights_digest and procs.losses == thread.losses
    assert 0 <= procs.loader_wait_s <= procs.seconds and procs.steady_samples_per_s > 0


def test_precision_is_float32_on_cpu_unless_asked_and_bf16_still_reproduces_the_probe(tmp_path):
    from hir_model.train.trainer import autocast_dtype
    assert autocast_dtype("auto", torch.device("cpu")) is None and autocast_dtype("fp32", torch.device("cuda")) is None
    assert autocast_dtype("auto", torch.device("cuda")) == autocast_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    data, _ = tiny_data()
    r = train_window(data, tiny_config(precision="bf16"), tmp_path / "b.pt", window="w0")
    assert r.precision == "bf16" and np.isfinite(r.losses).all()
    model = load_trained_model(tmp_path / "b.pt")  # the probe is embedded in float32 after training, as a reader does
    again = embed_nodes(model.encoder, model.global_tokens, data, np.array(r.probe_nodes), tiny_config())
    torch.testing.assert_close(again, torch.tensor(r.probe_embeddings), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("publish", ["teacher", "student"])
def test_the_checkpoint_exports_the_network_publish_names_and_reproduces_its_probe(tmp_path, publish):
    data, _ = tiny_data()
    cfg = tiny_config(publish=publish)
    r = train_window(data, cfg, tmp_path / "c.pt", window="w0")
    payload = load_checkpoint(tmp_path / "c.pt")
    chosen, other = (payload["extra"][publish], payload["extra"]["student" if publish == "teacher" else "teacher"])
    exported = payload["model"]
    assert all(torch.equal(v, chosen[f"encoder.{k}"]) for k, v in exported.items())
    assert not all(torch.equal(v, other[f"encoder.{k}"]) for k, v in exported.items())  # the two networks differ
    for l, p in enumerate(payload["prototypes"]):
        torch.testing.assert_close(p, torch.nn.functional.normalize(chosen[f"prototypes.{l}"].float(), dim=-1))
    model = load_trained_model(tmp_path / "c.pt")
    again = embed_nodes(model.encoder, model.global_tokens, data, np.array(r.probe_nodes), cfg)
    torch.testing.assert_close(again, torch.tensor(r.probe_embeddings), atol=1e-5, rtol=1e-5)
