"""A window's training inputs: the graph (as of the window end), content vectors by node, engagement pairs,
active nodes; and the per-step seed and view sampling (deterministic by (seed, step, shard))."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.vocab import ENGAGEABLE_TYPES
from hir_model.content.vectors import to_matrix
from hir_model.graph.csr import Graph
from hir_model.graph.sampler import sample
from hir_model.graph.storage import load_graph
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES, SampledBatch
from hir_model.train.config import NEGATIVE_EVENTS, PAIR_WEIGHTS, TrainConfig


@dataclass(frozen=True)
class TrainData:
    graph: Graph
    cutoff_us: int  # the window end: nothing at or after it is sampled
    active: np.ndarray  # int64 [A] nodes with an edge whose last_ts <= cutoff (the distillation seeds)
    pair_user: np.ndarray  # int64 [P] user node of each engagement pair
    pair_entity: np.ndarray  # int64 [P] entity node
    pair_sign: np.ndarray  # int64 [P] +1 positive, -1 explicit negative
    pair_prob: np.ndarray  # float64 [P] draw probability (deeper funnel stages weighted up)
    content: np.ndarray | None = None  # float32 [N, C] content vector per node (0 where missing)
    has_content: np.ndarray | None = None  # bool [N]
    pair_ts: np.ndarray | None = None  # int64 [P] each pair's event time (None: not known; no entity -> entity pairs)

    @cached_property
    def pair_log_q(self) -> np.ndarray:
        """float64 [2, P]: log of the probability that a drawn pair's user (row 0) / entity (row 1) is this pair's."""
        n = self.graph.num_nodes
        q_user = np.bincount(self.pair_user, weights=self.pair_prob, minlength=n)
        q_entity = np.bincount(self.pair_entity, weights=self.pair_prob, minlength=n)
        return np.log(np.stack([q_user[self.pair_user], q_entity[self.pair_entity]]))

    @cached_property
    def replay(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(user int64 [R], entity int64 [R], prob float64 [R]): the cumulative graph's user -> engageable engagement
        edges as of the cutoff (earlier windows' engagement, this one's too), drawn by decayed weight; explicit-negative
        edge types are left out."""
        g = self.graph
        src, code = g.src(), np.asarray(g.edge_type, np.int64)
        dst = np.asarray(g.neighbours, np.int64)
        node_type = np.asarray(g.nodes.node_type, np.int64)
        keep = (np.isin(code, POSITIVE_EDGE_CODES) & (node_type[src] == NODE_TYPES.index("user"))
                & np.isin(node_type[dst], ENGAGEABLE_CODES) & (np.asarray(g.last_ts) <= self.cutoff_us))
        w = np.asarray(g.weight, np.float64)[keep]
        return src[keep], dst[keep], w / w.sum() if len(w) else w

    @cached_property
    def _stream_log_q(self) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        return {}

    def stream_log_q(self, replay_share: float) -> tuple[np.ndarray, np.ndarray]:
        """float64 [N] each (users, entities): log of a node's probability of being a pair-stream row's user / entity (the
        window's pairs uniformly, one epoch's order, mixed with the replayed edges by their share); -inf where never."""
        if replay_share not in self._stream_log_q:
            self._stream_log_q[replay_share] = self._log_q_of_stream(replay_share)
        return self._stream_log_q[replay_share]

    def _log_q_of_stream(self, replay_share: float) -> tuple[np.ndarray, np.ndarray]:
        n = self.graph.num_nodes
        p = max(len(self.pair_user), 1)
        ru, re, rp = self.replay
        share = replay_share if len(ru) else 0.0
        out = []
        for own, rep in ((self.pair_user, ru), (self.pair_entity, re)):
            q = (1 - share) * np.bincount(own, minlength=n) / p + share * np.bincount(rep, weights=rp, minlength=n)
            with np.errstate(divide="ignore"):
                out.append(np.log(q))
        return out[0], out[1]

    @property
    def content_dim(self) -> int:
        return 0 if self.content is None else self.content.shape[1]


# Seeds, probes and collapse metrics cover users and ad entities; knowledge-graph nodes are context only (they are
# never published, and on MovieLens 32k of them would outnumber the 2.6k users and films 12 to 1).
SEED_TYPES: tuple[str, ...] = ("user",) + ENGAGEABLE_TYPES
ENGAGEABLE_CODES = np.array([NODE_TYPES.index(t) for t in ENGAGEABLE_TYPES], np.int64)  # their NODE_TYPES indices
POSITIVE_EDGE_CODES = np.array([EDGE_TYPES.index(t) for t in PAIR_WEIGHTS if t not in NEGATIVE_EVENTS and t in EDGE_TYPES],
                               np.int64)  # user -> entity engagement edges a replayed pair may come from


def active_nodes(graph: Graph, cutoff_us: int) -> np.ndarray:
    """int64 [A]: nodes of a SEED_TYPES type with an edge whose last_ts <= cutoff."""
    ok = np.asarray(graph.last_ts) <= cutoff_us  # (E,)
    src = np.repeat(np.arange(graph.num_nodes), np.diff(np.asarray(graph.indptr)))
    nodes = np.unique(src[ok]).astype(np.int64)
    seed_type = np.isin(np.asarray(graph.nodes.node_type, np.int64)[nodes], [NODE_TYPES.index(t) for t in SEED_TYPES])
    return nodes[seed_type]


def engagement_pairs(graph: Graph, events: Path | pa.Table | None, cutoff_us: int,
                     with_ts: bool = False) -> tuple[np.ndarray, ...]:
    """(user, entity, sign, prob) from raw_events (a parquet path or a table), then the events' times when `with_ts`;
    events at or after the cutoff are dropped."""
    empty = (np.zeros(0, np.int64),) * 3 + (np.zeros(0),) + ((np.zeros(0, np.int64),) if with_ts else ())
    if events is None or (not isinstance(events, pa.Table) and not Path(events).exists()):
        return empty
    t = events if isinstance(events, pa.Table) else pq.read_table(events, columns=["user_id", "entity_id", "event_type", "ts"])
    t = t.filter(pc.less(t.column("ts").cast("int64"), cutoff_us))
    if t.num_rows == 0:
        return empty
    user, entity = graph.nodes.index_of(t.column("user_id")), graph.nodes.index_of(t.column("entity_id"))
    enc = pc.dictionary_encode(t.column("event_type").combine_chunks())  # few distinct types, many rows
    names = enc.dictionary.to_pylist()
    code = np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)
    weight = np.array([PAIR_WEIGHTS.get(e, 0.0) for e in names])[code]
    sign = np.array([-1 if e in NEGATIVE_EVENTS else 1 for e in names], np.int64)[code]
    keep = (user >= 0) & (entity >= 0) & (weight > 0)
    w = weight[keep]
    out = user[keep].astype(np.int64), entity[keep].astype(np.int64), sign[keep], w / w.sum() if len(w) else w
    return out + ((np.asarray(t.column("ts").cast("int64"), np.int64)[keep],) if with_ts else ())


def with_item_pairs(data: TrainData, share: float, window: int) -> TrainData:
    """`data` with entity -> entity pairs taking `share` of the pairs' draw probability (item2vec over the window's
    sequences): each user's distinct positively engaged entities, in the order of their first engagement, pair up when
    at most `window` positions apart, both directions, a pair weighing the product of its entities' summed pair
    probabilities. The engagement term then pulls entities engaged one after the other together, as it pulls a user
    and what they engaged with; the kernel of the ranking head reads exactly that similarity. Unchanged when `share`
    is 0, the times are unknown or no user engaged with two entities."""
    if share <= 0 or data.pair_ts is None or not len(data.pair_user):
        return data
    pos = data.pair_sign > 0
    n = np.int64(data.graph.num_nodes)
    uniq, inverse = np.unique(data.pair_user[pos] * n + data.pair_entity[pos], return_inverse=True)
    first = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inverse, data.pair_ts[pos])
    weight = np.bincount(inverse, weights=data.pair_prob[pos], minlength=len(uniq))
    user, entity = uniq // n, uniq % n
    order = np.lexsort((entity, first, user))
    user, entity, weight, first = user[order], entity[order], weight[order], first[order]
    src, dst, val, ts = [], [], [], []
    for d in range(1, window + 1):
        a = np.flatnonzero(user[:-d] == user[d:])
        b = a + d
        src += [entity[a], entity[b]]
        dst += [entity[b], entity[a]]
        val += [weight[a] * weight[b]] * 2
        ts += [first[b]] * 2
    val_all = np.concatenate(val) if val else np.zeros(0)
    if not len(val_all) or val_all.sum() <= 0:
        return data
    prob = np.concatenate([data.pair_prob * (1 - share), share * val_all / val_all.sum()])
    return replace(data, pair_user=np.concatenate([data.pair_user, *src]), pair_entity=np.concatenate([data.pair_entity, *dst]),
                   pair_sign=np.concatenate([data.pair_sign, np.ones(len(val_all), np.int64)]), pair_prob=prob,
                   pair_ts=np.concatenate([data.pair_ts, *ts]))


def content_by_node(graph: Graph, content_path: Path | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """content_embeddings' fused `embedding` column aligned to graph nodes: (float32 [N, C], bool [N])."""
    if content_path is None or not Path(content_path).exists():
        return None, None
    return align_content(graph, pq.read_table(content_path, columns=["entity_id", "embedding"]))


def align_content(graph: Graph, t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A content table (entity_id, embedding; null: none) aligned to graph nodes: (float32 [N, C], bool [N])."""
    mat, valid = to_matrix(t.column("embedding"))  # (M, C), (M,)
    node = graph.nodes.index_of(t.column("entity_id"))  # (M,), -1 when unknown to the graph
    out, has = np.zeros((graph.num_nodes, mat.shape[1]), np.float32), np.zeros(graph.num_nodes, bool)
    ok = (node >= 0) & valid
    out[node[ok]], has[node[ok]] = mat[ok], True
    return out, has


def load_train_data(graph_dir: Path, events: Path | None = None, content: Path | None = None,
                    cutoff_us: int | None = None) -> TrainData:
    graph = load_graph(Path(graph_dir))
    cutoff = graph.as_of_us if cutoff_us is None else int(cutoff_us)
    user, entity, sign, prob, ts = engagement_pairs(graph, events, cutoff, with_ts=True)
    mat, has = content_by_node(graph, content)
    return TrainData(graph, cutoff, active_nodes(graph, cutoff), user, entity, sign, prob, mat, has, ts)


def with_content(batch: SampledBatch, data: TrainData, structure_dim: int = 0) -> SampledBatch:
    """`batch` with its tokens' content vectors (when the data has them) and structural encodings (`structure_dim` > 0:
    hir_model.graph.structure over the graph's engagement up to the data's cutoff)."""
    if structure_dim:
        batch = replace(batch, structure=data.graph.structure_at(batch.node, data.cutoff_us, structure_dim))
    if data.content is None:
        return batch
    return replace(batch, content=data.content[batch.node], has_content=data.has_content[batch.node])


def seed_only(batch: SampledBatch, which: np.ndarray) -> SampledBatch:
    """`batch` with the sequences flagged in `which` (bool [B]) cut to their seed token: the view a never-engaged
    entity has (its id, type and content). Other sequences are untouched (their local ancestor indices stay valid)."""
    owner = np.repeat(np.arange(batch.num_sequences), batch.lengths)  # (T,)
    in_flagged = np.asarray(which, bool)[owner]  # (T,) the token belongs to a flagged sequence
    keep = (batch.depth == 0) | ~in_flagged
    offsets = np.zeros_like(batch.offsets)
    np.cumsum(np.bincount(owner[keep], minlength=batch.num_sequences), out=offsets[1:])
    out = batch.take_tokens(keep, offsets=offsets)
    flagged = in_flagged[keep]  # (T',) the kept tokens of flagged sequences: their seeds
    cut = {}
    if out.strength is not None:  # a never-engaged entity has none: the flagged seeds lose theirs too
        cut.update(strength=np.where(flagged, 0.0, out.strength).astype(np.float32))
    if out.structure is not None:  # nor a place in the graph
        cut.update(structure=np.where(flagged[:, None], 0.0, out.structure).astype(np.float32))
    return replace(out, **cut)


@dataclass(frozen=True)
class PairBatch:
    """A step's pair batch (cfg.budget.pair_batch): Q pairs and M shared negatives, encoded on the student's narrow view only.
    Their sequences follow the B distillation seeds in StepBatch.narrow: users [B, B+Q), entities [B+Q, B+2Q),
    negatives [B+2Q, B+2Q+M)."""
    sign: np.ndarray  # int64 [Q] +1 positive, -1 explicit negative
    weight: np.ndarray  # float32 [Q] each row's weight in the engagement term (funnel stage; mean 1 over the window)
    log_q: np.ndarray | None  # float64 [2, Q] log stream probability of each row's user and entity (None: no correction)
    negatives: int  # M
    neg_log_q: np.ndarray | None  # float64 [M]
    neg_is_pos: np.ndarray  # bool [Q, M] the negative is the row's own entity (left out of its softmax)


@dataclass(frozen=True)
class StepBatch:
    """One shard of one step: B seeds = P pair users + P pair entities + the rest active nodes (+ a pair batch)."""
    narrow: SampledBatch  # the student's view (of the B seeds, then of the pair batch's nodes)
    broad: SampledBatch  # the teacher's view of the B seeds
    pairs: int  # P: seeds[:P] are users, seeds[P:2P] their entities
    sign: np.ndarray  # int64 [P]
    log_q: np.ndarray | None = None  # float64 [2, P] log draw probability of each pair's user and entity (cfg.objective.logq_correction)
    pair_batch: PairBatch | None = None

    @property
    def seeds(self) -> int:
        """B: the distillation seeds (both views)."""
        return self.broad.num_sequences


def pair_order(data: TrainData, cfg: TrainConfig, window_seed: int, steps: int) -> np.ndarray:
    """int64 [steps, window pairs per step]: which of the window's pairs each step's pair batch takes, the window's
    pairs in a fresh seeded permutation every epoch (every pair once per epoch)."""
    per_step = cfg.budget.pair_batch - cfg.budget.replay_pairs
    n = len(data.pair_user)
    if not n or not per_step:
        return np.zeros((steps, 0), np.int64)
    epochs = -(-steps * per_step // n)
    order = np.concatenate([np.random.default_rng([cfg.runtime.seed, window_seed, e]).permutation(n) for e in range(epochs)])
    return order[: steps * per_step].reshape(steps, per_step)


def pair_batch_nodes(data: TrainData, cfg: TrainConfig, own: np.ndarray, rng: np.random.Generator,
                     shard: int) -> tuple[np.ndarray, PairBatch]:
    """The nodes (int64 [2Q + M]: users, entities, negatives) and PairBatch of shard `shard` of a step whose window
    pairs are `own` (indices into the window's pairs, all shards'); replayed pairs and negatives drawn from `rng`."""
    shards, rep = cfg.runtime.shards, cfg.budget.replay_pairs
    own = np.array_split(np.asarray(own, np.int64), shards)[shard]
    ru, re, rp = data.replay
    k = rep // shards + (shard < rep % shards) if len(ru) else 0
    r = rng.choice(len(ru), size=k, p=rp) if k else np.zeros(0, np.int64)
    users = np.concatenate([data.pair_user[own], ru[r]])
    entities = np.concatenate([data.pair_entity[own], re[r]])
    sign = np.concatenate([data.pair_sign[own], np.ones(k, np.int64)])
    p = data.pair_prob
    weight = np.concatenate([p[own] * len(p) if len(p) else np.zeros(0), np.ones(k)]).astype(np.float32)
    log_u, log_e = data.stream_log_q(cfg.budget.replay_share) if cfg.objective.logq_correction else (None, None)
    m = cfg.budget.shared_negatives // shards
    negs = np.zeros(0, np.int64)
    if m and len(users):
        q_e = np.exp(data.stream_log_q(cfg.budget.replay_share)[1])  # (N,)
        negs = rng.choice(len(q_e), size=m, p=q_e / q_e.sum())
    batch = PairBatch(sign, weight, None if log_u is None else np.stack([log_u[users], log_e[entities]]), len(negs),
                      None if log_e is None else log_e[negs], entities[:, None] == negs[None, :])
    return np.concatenate([users, entities, negs]).astype(np.int64), batch


def step_batch(data: TrainData, cfg: TrainConfig, step: int, shard: int, own_pairs: np.ndarray | None = None) -> StepBatch:
    """Shard `shard` of step `step`: the same on any rank or process (rng from (seed, step, shard)). With cfg.budget.pair_batch,
    `own_pairs` (a row of pair_order, or None: drawn by pair_prob) are the window pairs of the step's pair batch."""
    rng = np.random.default_rng([cfg.runtime.seed, step, shard])
    b = cfg.budget.batch_size // cfg.runtime.shards
    p = int(b * cfg.budget.pair_share) // 2 if len(data.pair_user) else 0  # pair_share of the seeds come from pairs (P users + P entities)
    idx = rng.choice(len(data.pair_user), size=p, p=data.pair_prob) if p else np.zeros(0, np.int64)
    rest = rng.choice(data.active, size=b - 2 * p, replace=len(data.active) < b - 2 * p)
    seeds = np.concatenate([data.pair_user[idx], data.pair_entity[idx], rest]).astype(np.int64)
    pb, student_seeds = None, seeds
    if cfg.budget.pair_batch and len(data.pair_user):
        if own_pairs is None:  # no epoch order given (held-out batches): the window's share drawn by pair_prob
            own_pairs = rng.choice(len(data.pair_user), size=cfg.budget.pair_batch - cfg.budget.replay_pairs, p=data.pair_prob)
        extra, pb = pair_batch_nodes(data, cfg, own_pairs, rng, shard)
        student_seeds = np.concatenate([seeds, extra])
    dim = cfg.encoder.structure_dim
    narrow = with_content(sample(data.graph, student_seeds, data.cutoff_us, cfg.narrow, rng), data, dim)
    broad = with_content(sample(data.graph, seeds, data.cutoff_us, cfg.broad, rng), data, dim)
    if cfg.objective.cold_share > 0:  # DropoutNet-style: the student sees some entities as if new, the teacher their history
        engageable = np.isin(np.asarray(data.graph.nodes.node_type, np.int64)[student_seeds], ENGAGEABLE_CODES)
        narrow = seed_only(narrow, engageable & (rng.random(len(student_seeds)) < cfg.objective.cold_share))
    log_q = data.pair_log_q[:, idx] if cfg.objective.logq_correction and p else None
    return StepBatch(narrow, broad, p, data.pair_sign[idx], log_q, pb)


def view_of(data: TrainData, nodes: np.ndarray, cfg: TrainConfig, seed: int, broad: bool = True) -> SampledBatch:
    """A deterministic view of given nodes (probe batches, metrics, embedding export)."""
    rng = np.random.default_rng([cfg.runtime.seed, seed])
    return with_content(sample(data.graph, np.asarray(nodes, np.int64), data.cutoff_us, cfg.broad if broad else cfg.narrow, rng), data,
                        cfg.encoder.structure_dim)
