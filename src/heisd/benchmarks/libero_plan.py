"""From a LIBERO task's BDDL goal to an ordered list of skills (no simulator: what the plan needs
from the scene comes in as plain sets).

The goal is LIBERO's parsed conjunction, e.g. ``[["in", "akita_black_bowl_1",
"wooden_cabinet_1_top_region"]]`` or ``[["turnon", "flat_stove_1"], ["on", "moka_pot_1",
"flat_stove_1_cook_region"]]``. Each ``On``/``In`` becomes a pick-and-place (a push for objects too
wide and flat to grasp, like a plate; for a place under a roof, like a microwave's inside, a
pick-and-place to the enclosure's mouth, then an insert from the side), preceded by opening the
drawer or door the place is behind when it is not open; ``Open`` and ``TurnOn`` become their skills
in the goal's order; ``Close`` goals come last, after everything that had to go inside. Objects put
on one region go side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from heisd.errors import UsageError

SKILLS = ("pick_place", "push", "stage", "insert", "open", "close", "turn_on")
PLACE_RELATIONS = ("on", "in")


@dataclass(frozen=True)
class Step:
    skill: str  # one of SKILLS (`TaskExpert` makes a hinged door's close "close_door" and may add "widen_door")
    target: str  # the object moved, or the articulated region/fixture worked
    place: str | None = None  # pick_place/push: the object or region it ends on or in
    relation: str | None = None  # pick_place/push: "on" or "in"
    slot: int = 0  # several objects on one region: this one's place among them (side by side, not stacked)
    slots: int = 1


def plan(goal: list[list[str]], closed: frozenset[str] = frozenset(),
         pushable: frozenset[str] = frozenset(), enclosed: frozenset[str] = frozenset()) -> list[Step]:
    """The steps that reach `goal`. `closed`: places behind a closed drawer or door now;
    `pushable`: objects the fingers cannot take, slid instead; `enclosed`: places under a roof too
    low for a hand that holds an object from above."""
    steps: list[Step] = []
    last: list[Step] = []
    opened: set[str] = set()
    for predicate in goal:
        name, *args = [a.lower() for a in predicate]
        if name in PLACE_RELATIONS and len(args) == 2:
            obj, place = args
            if place in closed and place not in opened:
                steps.append(Step("open", place))
                opened.add(place)
            if place in enclosed:
                steps += [Step("stage", obj, place, name), Step("insert", obj, place, name)]
            else:
                steps.append(Step("push" if obj in pushable else "pick_place", obj, place, name))
        elif name == "open" and len(args) == 1:
            if args[0] not in opened:
                steps.append(Step("open", args[0]))
                opened.add(args[0])
        elif name == "turnon" and len(args) == 1:
            steps.append(Step("turn_on", args[0]))
        elif name == "close" and len(args) == 1:
            last.append(Step("close", args[0]))
        else:
            raise UsageError(f"no scripted skill reaches the goal predicate {predicate}")
    steps = _share_regions(steps)
    return steps + last


def _share_regions(steps: list[Step]) -> list[Step]:
    """Objects put `on` the same region (both moka pots on the stove) get side-by-side slots."""
    sharing: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        if step.relation == "on":
            sharing.setdefault(step.place, []).append(i)
    out = list(steps)
    for group in sharing.values():
        if len(group) > 1:
            for slot, i in enumerate(group):
                out[i] = replace(steps[i], slot=slot, slots=len(group))
    return out
