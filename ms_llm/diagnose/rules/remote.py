"""`ms-llm diagnose` on the run's remote copies: checkpoints that never reached checkpoint.remote_dir."""
from ms_llm.diagnose.common import Finding, cause, quoted, steps_text
from ms_llm.rundir.uploads import remote_copies
from ms_llm.diagnose.registry import EVAL, rule


@rule(finds=('remote_copies',), live=EVAL)
def rule_remote_copies(run, found, _):
    copies = remote_copies(run)
    if copies is None or not copies.only_local:
        return None
    newest = max(copies.saved)
    local = copies.only_local
    behind = newest in local
    uploaded = sorted(copies.uploaded)
    ev = [copies.describe(s) for s in local[:10]]
    ev.append(f"in {copies.remote}: " + (f"steps {steps_text(uploaded)}" if uploaded else "no checkpoint"))
    errors = " ".join(str(e.get("error", "")) for e in copies.failed.values())
    causes = []
    if any(w in errors for w in ("Connect", "Endpoint", "Timeout", "Connection", "budget")):
        causes.append(cause("the object store was unreachable or too slow for checkpoint.upload_budget_s", "high"))
    if any(w in errors for w in ("500", "503", "InternalError", "SlowDown", "ServiceUnavailable")):
        causes.append(cause("the object store answered server errors (HTTP 5xx) for longer than the budget", "high"))
    if any(w in errors for w in ("AccessDenied", "403", "InvalidAccessKeyId", "Signature", "Expired")):
        causes.append(cause("the credentials stopped working (expired temporary token, revoked key)", "high"))
    if not copies.failed:
        causes.append(cause("the process ended (crash, kill -9) before the background upload finished", "medium"))
    causes.append(cause("a transient network outage longer than checkpoint.upload_budget_s", "low"))
    actions = [f"copy them by hand: aws s3 cp --recursive {quoted(run.path)}/checkpoints {copies.remote}/checkpoints "
               f"(or obsutil / the ModelArts console for obs://)",
               "raise checkpoint.upload_budget_s if the store is slow rather than down"]
    what = "the newest checkpoint" if behind else f"{len(local)} older checkpoint(s)"
    return [Finding("remote_copies", "warning" if behind else "info",
                    f"{what} only local: {len(local)} of {len(copies.saved)} never reached {copies.remote} "
                    f"(steps {steps_text(local)})", ev, causes, actions, local[:10])]
