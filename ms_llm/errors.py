"""The one exception type that reaches the user as a message instead of a traceback."""


class UserError(Exception):
    """Bad input (config, data, checkpoint, CLI args): printed as one paragraph, exit code 2.

    The message must name the problem (field, value) and the fix. Raise it before anything on disk
    is touched, so that refusing never costs the user earlier work.
    """

    exit_code = 2


def closest(name, candidates):
    """The candidate most similar to `name` (for 'did you mean' hints), or None."""
    import difflib

    hits = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return hits[0] if hits else None
