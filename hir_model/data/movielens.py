"""MovieLens-100K with Freebase KG links (RecBole's `ml-100k` files) as a Source.

Mapping
- Ratings -> events. One event per rating: event_id `ml:<user>:<item>`, user_id `user:<u>`, entity_id
  `movie:<item>` (entity_type `product`), event_type `purchase` when rating >= 4 (the deep-funnel
  conversion) else `click`, ts the rating time (UTC), value the rating.
- Movies -> `product` entities `movie:<item>`: title, a description built from the release year, the
  genres and counts of the movie's KG facts (Freebase mids carry no names), category the first genre,
  features {release_year}. A movie is first seen at its first rating; movies never rated don't exist.
- Advertisers. Each linked movie's parent is taken from the KG in priority order: production company
  (film.film.production_companies), else director (film.film.directed_by), else producer
  (film.film.produced_by); among several candidates of one kind the one linked to the most films in the
  whole KG wins (static metadata, ties by mid). The parent is an `advertiser` `fb:<mid>` (category
  studio/director/producer) first seen with its first film; its description lists its films known by
  `end`. Movies without a KG link or without any of those relations have no parent.
- Every other KG node linked to a known movie is a `kg_entity` `fb:<mid>` (category the relation kind:
  actor, genre, writer, award, ...; the most frequent kind when several), first seen with its first
  linked movie; its description lists its films known by `end`. A chosen advertiser stays an advertiser,
  and a node that is itself a MovieLens movie is that `movie:<item>`.
- Users -> `user` entities `user:<u>` with features {age_bucket, gender, occupation, region (first zip
  digit, `unknown` for non-numeric zips)}, first seen at their first rating.
- Relations: KG triples normalised to movie -> other with film.film.* names (reverse duplicates such as
  film.director.film dropped; a prequel between two movies becomes the sequel edge the other way),
  first seen when both ends are. The movie -> parent edge is implied by parent_id and not repeated.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA, RELATIONS_SCHEMA
from hir_model.data.fetch import FILES, fetch_movielens
from hir_model.data.source import Batch, Source
from hir_model.data.windows import Window, utc
from hir_model.files_cache import cached

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
CONVERSION_RATING = 4.0  # ratings at or above this are purchases
LISTED_FILMS = 5  # films named in an advertiser's / KG node's description
# Reverse Freebase relations -> their film.film.* form (head and tail swap).
REVERSE = {
    "film.actor.film": "film.film.actor",
    "film.cinematographer.film": "film.film.cinematography",
    "film.content_rating.film": "film.film.rating",
    "film.director.film": "film.film.directed_by",
    "film.film_genre.films_in_this_genre": "film.film.genre",
    "film.film_subject.films": "film.film.subjects",
    "film.producer.film": "film.film.produced_by",
    "film.production_company.films": "film.film.production_companies",
    "film.writer.film": "film.film.written_by",
    "film.film.prequel": "film.film.sequel",
}
KIND = {
    "film.film.production_companies": "studio", "film.film.directed_by": "director",
    "film.film.produced_by": "producer", "film.film.written_by": "writer", "film.film.actor": "actor",
    "film.film.cinematography": "cinematographer", "film.film.genre": "genre", "film.film.language": "language",
    "film.film.country": "country", "film.film.rating": "content_rating", "film.film.award_won": "award",
    "film.film.award_nomination": "award", "film.film.subjects": "subject", "film.film.sequel": "film",
    "film.film.prequel": "film",
}
PARENT_RELATIONS = ("film.film.production_companies", "film.film.directed_by", "film.film.produced_by")
# Phrases for a movie's description: (kind, singular, plural) in the order they are written.
FACTS = (("director", "Directed by 1 director", "Directed by {} directors"), ("writer", "1 writer", "{} writers"),
         ("producer", "1 producer", "{} producers"), ("studio", "1 production company", "{} production companies"),
         ("actor", "1 credited actor", "{} credited actors"), ("cinematographer", "1 cinematographer", "{} cinematographers"),
         ("award", "1 award won or nominated", "{} awards won or nominated"), ("subject", "1 subject", "{} subjects"),
         ("language", "1 language", "{} languages"), ("country", "1 country", "{} countries"),
         ("film", "1 sequel or prequel", "{} sequels or prequels"))
AGE_BUCKETS = ((18, "<18"), (25, "18-24"), (35, "25-34"), (45, "35-44"), (55, "45-54"), (999, "55+"))


def _us(ts: datetime) -> int:
    return (utc(ts) - EPOCH) // timedelta(microseconds=1)


def _read(path: Path) -> pd.DataFrame:
    """A RecBole atomic file: tab-separated, typed headers like `user_id:token` (types dropped)."""
    df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=csv.QUOTE_NONE)
    return df.rename(columns=lambda c: c.split(":")[0])


@dataclass(frozen=True)
class _Tables:
    """Everything parsed once. Times are int64 UTC microseconds; static tables are sorted by them."""

    events: pa.Table  # EVENTS_SCHEMA, sorted by ts
    event_ts: np.ndarray  # (E,) the events' ts
    static: pa.Table  # CATALOG_SCHEMA: users and products, sorted by first_seen_ts
    static_seen: np.ndarray  # (S,)
    nodes: pd.DataFrame  # advertisers and kg entities: entity_id, entity_type, category, title, first_seen
    members: pd.DataFrame  # node_id, label, seen: the films each node describes, sorted by node, seen
    relations: pa.Table  # RELATIONS_SCHEMA, sorted by first_seen_ts
    relation_seen: np.ndarray  # (R,)


class MovieLensSource(Source):
    name = "movielens"

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.root = self.data_dir / "ml-100k"
        self._tables: _Tables | None = None

    def prepare(self) -> None:
        fetch_movielens(self.data_dir)

    def _path(self, ext: str) -> str:
        return str(self.root / f"ml-100k.{ext}")

    @property
    def tables(self) -> _Tables:
        if self._tables is None:
            missing = [name for name in FILES if not (self.root / name).is_file()]
            if missing:
                raise FileNotFoundError(f"{self.root} lacks {missing}: call prepare() or run "
                                        f"`python -m hir_model.data.fetch {self.data_dir}`")
            # one parse per process while the files are unchanged (about 1 s a parse, 3-4 sources a demo window)
            self._tables = cached(("movielens", str(self.root.resolve())), [self.root / name for name in FILES], self._load)
        return self._tables

    def catalog_inputs(self) -> list[Path]:
        """The RecBole files every catalogue row is derived from (a movie is first seen at its first rating)."""
        return [self.root / name for name in FILES if (self.root / name).is_file()]

    def span(self) -> tuple[datetime, datetime]:
        ts = self.tables.event_ts
        return EPOCH + timedelta(microseconds=int(ts[0])), EPOCH + timedelta(microseconds=int(ts[-1]))

    def events(self, window: Window, batch_rows: int = 65_536) -> Iterator[Batch]:
        t = self.tables
        lo, hi = np.searchsorted(t.event_ts, [_us(window.start), _us(window.end)], side="left")
        for start in range(lo, hi, batch_rows):
            yield Batch(self._path("inter"), t.events.slice(start, min(batch_rows, hi - start)))

    def relations(self, end: datetime) -> Iterator[Batch]:
        t = self.tables
        n = int(np.searchsorted(t.relation_seen, _us(end), side="left"))
        yield Batch(",".join(self._path(e) for e in ("kg", "link", "inter")), t.relations.slice(0, n))

    def catalog(self, end: datetime) -> Iterator[Batch]:
        t, end_us = self.tables, _us(end)
        static = t.static.slice(0, int(np.searchsorted(t.static_seen, end_us, side="left")))
        origin = ",".join(self._path(e) for e in ("user", "item", "kg", "link", "inter"))
        yield Batch(origin, pa.concat_tables([static, self._nodes(end_us)]))

    def _nodes(self, end_us: int) -> pa.Table:
        """Advertisers and KG entities known at `end`, described by the films known at `end`."""
        t = self.tables
        nodes = t.nodes[t.nodes.first_seen < end_us]
        if nodes.empty:
            return CATALOG_SCHEMA.empty_table()
        members = t.members[t.members.seen < end_us]
        rank = members.groupby("node_id", sort=False).cumcount()
        wide = members[rank < LISTED_FILMS].assign(rank=rank).pivot(index="node_id", columns="rank", values="label")
        names = wide[0]
        for k in wide.columns[1:]:  # vectorised "; ".join of each node's first films
            names = names + ("; " + wide[k]).fillna("")
        # Only the first films (by first rating), no running count: the text stops changing once they are
        # known, so content embeddings are not recomputed every week for every KG node.
        lead = nodes.title.str[:1].str.upper() + nodes.title.str[1:] + ". Films: "
        desc = lead + nodes.entity_id.map(names) + "."
        return pa.table({
            "entity_id": nodes.entity_id.to_numpy(), "entity_type": nodes.entity_type.to_numpy(),
            "parent_id": pa.nulls(len(nodes), pa.string()),
            "first_seen_ts": pa.array(nodes.first_seen.to_numpy(np.int64), CATALOG_SCHEMA.field("first_seen_ts").type),
            "title": nodes.title.to_numpy(), "description": desc.to_numpy(), "category": nodes.category.to_numpy(),
            "image_uri": pa.nulls(len(nodes), pa.string()), "video_uri": pa.nulls(len(nodes), pa.string()),
            "features": pa.nulls(len(nodes), CATALOG_SCHEMA.field("features").type),
        }, schema=CATALOG_SCHEMA)

    def _load(self) -> _Tables:
        ratings = pd.read_csv(self._path("inter"), sep="\t", quoting=csv.QUOTE_NONE,
                              dtype={0: str, 1: str, 2: float, 3: float}, keep_default_na=False)
        ratings.columns = ["user", "item", "rating", "ts"]
        ratings["ts"] = (ratings.ts.astype(np.int64) * 1_000_000).astype(np.int64)
        ratings = ratings.sort_values(["ts", "user", "item"], kind="stable", ignore_index=True)
        events = pa.table({
            "event_id": ("ml:" + ratings.user + ":" + ratings.item).to_numpy(),
            "user_id": ("user:" + ratings.user).to_numpy(), "entity_id": ("movie:" + ratings.item).to_numpy(),
            "entity_type": np.full(len(ratings), "product"),
            "event_type": np.where(ratings.rating >= CONVERSION_RATING, "purchase", "click"),
            "ts": pa.array(ratings.ts.to_numpy(), EVENTS_SCHEMA.field("ts").type), "value": ratings.rating.to_numpy(),
        }, schema=EVENTS_SCHEMA)

        movies = _read(self._path("item")).rename(columns={"movie_title": "title", "class": "genres"})
        movies["seen"] = movies.item_id.map(ratings.groupby("item").ts.min())
        movies = movies.dropna(subset=["seen"]).astype({"seen": np.int64})
        movies["title"] = movies.title.replace("unkonwn", "unknown")  # item 267's typo in the source
        movies["year"] = movies.release_year.where(movies.release_year.str.fullmatch(r"\d{4}"))
        movies["label"] = movies.title + np.where(movies.year.notna(), " (" + movies.year.fillna("") + ")", "")
        movies["entity_id"] = "movie:" + movies.item_id

        edges, parents = self._kg(movies)
        members, nodes = self._members(edges, parents, movies)
        static = pa.concat_tables([self._users(ratings), self._products(movies, edges, parents)])
        static = static.sort_by([("first_seen_ts", "ascending"), ("entity_id", "ascending")])

        seen = pd.concat([movies.set_index("entity_id").seen, nodes.set_index("entity_id").first_seen])
        edges = edges.merge(parents[["src", "relation", "dst"]], how="left", indicator=True)
        edges = edges[edges._merge == "left_only"]  # movie -> parent is implied by parent_id
        first = np.maximum(edges.src.map(seen).to_numpy(np.int64), edges.dst.map(seen).to_numpy(np.int64))
        edges = edges.assign(first_seen=first).sort_values(["first_seen", "src", "relation", "dst"], ignore_index=True)
        relations = pa.table({
            "src_id": edges.src.to_numpy(), "relation": edges.relation.to_numpy(), "dst_id": edges.dst.to_numpy(),
            "first_seen_ts": pa.array(edges.first_seen.to_numpy(), RELATIONS_SCHEMA.field("first_seen_ts").type),
        }, schema=RELATIONS_SCHEMA)
        return _Tables(events, ratings.ts.to_numpy(), static, static["first_seen_ts"].cast(pa.int64()).to_numpy(),
                       nodes, members, relations, edges.first_seen.to_numpy())

    def _kg(self, movies: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """KG edges src (a known movie) -> dst, with relation and kind; and each movie's chosen parent."""
        kg = _read(self._path("kg"))
        kg.columns = ["h", "relation", "t"]
        link = _read(self._path("link"))
        film = dict(zip(link.entity_id, "movie:" + link.item_id))
        rev = kg.relation.isin(REVERSE).to_numpy()
        kg = pd.DataFrame({"h": np.where(rev, kg.t, kg.h), "relation": kg.relation.replace(REVERSE),
                           "t": np.where(rev, kg.h, kg.t)})
        # a sequel edge whose movie end is the tail is kept as the tail's prequel
        flip = ~kg.h.isin(film) & kg.t.isin(film) & (kg.relation == "film.film.sequel")
        kg.loc[flip, ["h", "t"]] = kg.loc[flip, ["t", "h"]].to_numpy()
        kg.loc[flip, "relation"] = "film.film.prequel"
        kg = kg[kg.h.isin(film)].drop_duplicates()
        kg["degree"] = kg.groupby(["relation", "t"]).t.transform("size")
        edges = pd.DataFrame({"src": kg.h.map(film), "relation": kg.relation, "dst": kg.t.map(film).fillna("fb:" + kg.t),
                              "kind": kg.relation.map(KIND).fillna(kg.relation.str.rsplit(".", n=1).str[-1]),
                              "degree": kg.degree})
        known = set(movies.entity_id)
        edges = edges[edges.src.isin(known) & (~edges.dst.str.startswith("movie:") | edges.dst.isin(known))]
        cand = edges[edges.relation.isin(PARENT_RELATIONS) & edges.dst.str.startswith("fb:")]
        cand = cand.assign(rank=cand.relation.map({r: i for i, r in enumerate(PARENT_RELATIONS)}))
        parents = cand.sort_values(["src", "rank", "degree", "dst"], ascending=[True, True, False, True])
        return edges.drop(columns="degree").reset_index(drop=True), parents.drop_duplicates("src")

    @staticmethod
    def _members(edges: pd.DataFrame, parents: pd.DataFrame, movies: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Nodes (advertisers, then KG entities) and the films each is described by."""
        label, seen = movies.set_index("entity_id").label, movies.set_index("entity_id").seen
        adv = parents.sort_values("rank").drop_duplicates("dst").assign(entity_type="advertiser")
        other = edges[edges.dst.str.startswith("fb:") & ~edges.dst.isin(adv.dst)]
        kinds = other.groupby(["dst", "kind"]).size().rename("n").reset_index()
        kg = kinds.sort_values(["dst", "n", "kind"], ascending=[True, False, True]).drop_duplicates("dst")
        nodes = pd.concat([adv[["dst", "kind", "entity_type"]], kg[["dst", "kind"]].assign(entity_type="kg_entity")])
        nodes = nodes.rename(columns={"dst": "entity_id", "kind": "category"}).reset_index(drop=True)
        nodes["title"] = nodes.category.str.replace("_", " ") + " " + nodes.entity_id
        members = pd.concat([parents[["dst", "src"]], other[["dst", "src"]].drop_duplicates()])
        members = pd.DataFrame({"node_id": members.dst, "src": members.src, "label": members.src.map(label),
                                "seen": members.src.map(seen)}).sort_values(["node_id", "seen", "src"], ignore_index=True)
        nodes["first_seen"] = nodes.entity_id.map(members.groupby("node_id").seen.min())
        return members, nodes

    def _users(self, ratings: pd.DataFrame) -> pa.Table:
        users = _read(self._path("user"))
        users["seen"] = users.user_id.map(ratings.groupby("user").ts.min())
        users = users.dropna(subset=["seen"])
        age = pd.to_numeric(users.age, errors="coerce")
        bucket = pd.cut(age, [-1] + [b for b, _ in AGE_BUCKETS], right=False, labels=[n for _, n in AGE_BUCKETS])
        region = np.where(users.zip_code.str.fullmatch(r"\d+"), users.zip_code.str[:1], "unknown")
        features = [[("age_bucket", "unknown" if pd.isna(b) else str(b)), ("gender", g), ("occupation", o), ("region", r)]
                    for b, g, o, r in zip(bucket, users.gender, users.occupation, region)]
        n = len(users)
        return pa.table({
            "entity_id": ("user:" + users.user_id).to_numpy(), "entity_type": np.full(n, "user"),
            "parent_id": pa.nulls(n, pa.string()),
            "first_seen_ts": pa.array(users.seen.to_numpy(np.int64), CATALOG_SCHEMA.field("first_seen_ts").type),
            "title": pa.nulls(n, pa.string()), "description": pa.nulls(n, pa.string()),
            "category": pa.nulls(n, pa.string()), "image_uri": pa.nulls(n, pa.string()),
            "video_uri": pa.nulls(n, pa.string()), "features": pa.array(features, CATALOG_SCHEMA.field("features").type),
        }, schema=CATALOG_SCHEMA)

    @staticmethod
    def _products(movies: pd.DataFrame, edges: pd.DataFrame, parents: pd.DataFrame) -> pa.Table:
        genres = movies.genres.str.split(" ")
        desc = movies.label + ". Genres: " + genres.str.join(", ") + "."
        counts = edges.groupby(["src", "kind"]).dst.nunique().unstack(fill_value=0)
        counts = counts.reindex(index=movies.entity_id, columns=[k for k, _, _ in FACTS], fill_value=0)
        facts = pd.Series("", index=movies.entity_id)
        for kind, one, many in FACTS:
            n = counts[kind]
            phrase = pd.Series(np.where(n == 1, one, [many.format(k) for k in n]), index=n.index)
            facts = facts + np.where(n > 0, np.where(facts == "", "", "; ") + phrase, "")
        parent = movies.entity_id.map(parents.set_index("src").dst)
        role = movies.entity_id.map(parents.set_index("src").relation.map(KIND))
        desc = desc + np.where(facts.to_numpy() != "", " " + facts.to_numpy() + ".", "")
        desc = desc + np.where(parent.notna(), " From " + role.fillna("") + " " + parent.fillna("") + ".", "")
        features = [[("release_year", y)] if isinstance(y, str) else [] for y in movies.year]
        n = len(movies)
        return pa.table({
            "entity_id": movies.entity_id.to_numpy(), "entity_type": np.full(n, "product"),
            "parent_id": pa.array(parent.to_numpy(), pa.string(), from_pandas=True),
            "first_seen_ts": pa.array(movies.seen.to_numpy(np.int64), CATALOG_SCHEMA.field("first_seen_ts").type),
            "title": movies.title.to_numpy(), "description": desc.to_numpy(), "category": genres.str[0].to_numpy(),
            "image_uri": pa.nulls(n, pa.string()), "video_uri": pa.nulls(n, pa.string()),
            "features": pa.array(features, CATALOG_SCHEMA.field("features").type),
        }, schema=CATALOG_SCHEMA)
