"""Vocabularies shared by the contracts and by the model (no heavy imports here)."""

# Ordered funnel: a later stage implies deeper intent. Explicit feedback follows.
FUNNEL_STAGES: tuple[str, ...] = ("impression", "click", "add_to_cart", "purchase")
EXPLICIT_FEEDBACK: tuple[str, ...] = ("interested", "not_interested")
EVENT_TYPES: tuple[str, ...] = FUNNEL_STAGES + EXPLICIT_FEEDBACK

# The deep-funnel conversion that HIR exists to connect to latent interest.
CONVERSION_EVENT = "purchase"

ENTITY_TYPES: tuple[str, ...] = ("user", "advertiser", "product", "service", "campaign", "kg_entity")
# Entities an engagement event may point at (users engage with ad entities, not with users or KG nodes).
ENGAGEABLE_TYPES: tuple[str, ...] = ("advertiser", "product", "service", "campaign")


def funnel_rank(event_type: str) -> int:
    """Position in the funnel (impression=0 ... purchase=3); explicit feedback has no rank."""
    try:
        return FUNNEL_STAGES.index(event_type)
    except ValueError as exc:
        raise ValueError(f"{event_type!r} is not a funnel stage; stages are {FUNNEL_STAGES}") from exc
