"""What goes wrong in a repair, and how the caller tells: every module of the repair raises these, none defines its
own kind of failure elsewhere (``zookeeper.lock.LockHeld`` is the lock's)."""

from __future__ import annotations


class RepairError(RuntimeError):
    """A step could not be completed, or a plan cannot be made or run; the chain halts (the message says why)."""


class FenceLost(RepairError):
    """This worker lost the session its lock was taken with: it stops at once, writing nothing more (not even its
    journal, which a newer worker of the same run may own by now) and starting nothing."""


class ApprovalError(RepairError):
    """No valid human approval of this plan is on record: nothing is touched (the message says what is missing)."""
