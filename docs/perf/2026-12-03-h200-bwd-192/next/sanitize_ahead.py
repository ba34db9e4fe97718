"""sanitize.py with every wgmma backward tile on scores_ahead (force_ahead)."""
import sys
import force_ahead  # noqa: F401
sys.argv = sys.argv[:3]
exec(open(__file__.replace("next/sanitize_ahead.py", "sanitize.py")).read())
