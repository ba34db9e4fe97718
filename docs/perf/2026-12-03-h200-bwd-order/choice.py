"""The tables a run uses: /tmp/choice.json (written by decide.py) patched into cute_fa.tuning.
forced(): the chosen entries, and in every other slot the dq_before_dk variant (for the tests)."""
import json, os
import cute_fa.tuning as T

PATH = "/tmp/choice.json"


def load():
    return json.load(open(PATH)) if os.path.exists(PATH) else {"chosen": {}, "forced": {}}


def patch(which="chosen"):
    c = load()[which]
    for table, entries in c.items():
        t = dict(getattr(T, table))  # a table the slot's own key may be missing from
        for cls, entry in entries.items():
            t[int(cls)] = tuple(entry)
        setattr(T, table, t)
    try:
        from cute_fa.runtime.plan import clear_plans
        clear_plans()
    except Exception:
        pass
    return c
