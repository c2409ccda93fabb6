"""The synthetic ecosystem's settings and its scale presets (small = the demo's ecosystem).

Its own module so that the world (`synthetic_world.py`) and the source (`synthetic.py`) both import it and
not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone


@dataclass(frozen=True)
class SyntheticConfig:
    seed: int = 7  # same seed, same data
    start: datetime = datetime(2024, 1, 7, tzinfo=timezone.utc)  # a Sunday: weekly windows line up
    n_windows: int = 8  # windows of events
    window_days: int = 7  # length of one window
    events_per_window: int = 20_000  # rows per window; 1_250_000 gives 10M over 8 windows
    branching: tuple[int, int, int] = (4, 3, 3)  # coarse -> mid -> fine: 36 fine interests
    n_advertisers: int = 60  # present at `start`
    n_products: int = 2_000
    n_users: int = 3_000
    campaigns_per_advertiser: int = 2
    new_advertisers_per_window: int = 4  # first seen inside each window
    new_products_per_window: int = 150
    new_users_per_window: int = 150
    interests_per_user: int = 3  # each user has 1..this many fine interests
    drift: float = 0.8  # amplitude of the oscillation of a user's log interest weights
    drift_period: float = 6.0  # windows per oscillation
    zipf_exponent: float = 1.0  # popularity weight = U^-s: Zipf's law at s = 1
    targeted_share: float = 0.7  # impressions drawn from the user's interests; the rest by popularity alone
    campaign_share: float = 0.08  # impressions on campaigns
    advertiser_share: float = 0.04  # impressions on advertisers (the rest: products)
    click_rate: tuple[float, float] = (0.004, 0.08)  # P(click | impression) at affinity 0 and 1
    cart_rate: float = 0.3  # P(add_to_cart | click) at affinity 1 (half that at 0); products only
    purchase_rate: float = 0.3  # P(purchase | add_to_cart) at affinity 1 (half that at 0)
    feedback_rate: float = 0.01  # P(interested or not_interested | impression)
    mean_gap_s: float = 600.0  # mean seconds between a pair's consecutive funnel events
    batch_rows: int = 65_536  # at most this many rows per yielded batch
    image_size: int = 32  # product images are image_size x image_size PNGs
    vocab_words: int = 12  # pseudo-words per fine interest (mid and coarse get fewer)
    filler_words: int = 60  # shared words that carry no interest

    def __post_init__(self) -> None:
        for name in ("branching", "click_rate"):  # lists from TOML/JSON overrides
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.branching) != 3 or min(self.branching) < 1:
            raise ValueError(f"branching must be three positive ints, got {self.branching}")
        for name in ("n_windows", "window_days", "n_advertisers", "n_products", "n_users", "interests_per_user",
                     "batch_rows", "image_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"SyntheticConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.campaign_share + self.advertiser_share >= 1:
            raise ValueError("campaign_share + advertiser_share must leave room for product impressions")


# Fields that grow with the preset's factor: entities and events together, so events per user stay the same.
SCALED_FIELDS = ("events_per_window", "n_advertisers", "n_products", "n_users", "new_advertisers_per_window",
                 "new_products_per_window", "new_users_per_window")
SCALES = {"small": 1, "medium": 10, "large": 100, "xl": 1000}  # small: the demo; xl: 3M users, 2M products, 20M events a window
DEFAULT_SCALE = "small"


def preset(scale: str = DEFAULT_SCALE) -> SyntheticConfig:
    """The config of a named scale: SyntheticConfig's defaults with SCALED_FIELDS times SCALES[scale]."""
    if scale not in SCALES:
        raise ValueError(f"synthetic scale {scale!r} is not one of {tuple(SCALES)}")
    base = SyntheticConfig()
    return replace(base, **{name: getattr(base, name) * SCALES[scale] for name in SCALED_FIELDS})
