"""Warnings for job settings that validate but cannot work as meant.

``wardenctl submit`` prints them and submits anyway: each is a judgement about
this machine and this model, not a rule of the format.
"""

from __future__ import annotations

from jobwarden.jobfile import Job

JAX_WORKER_MB = 256
"""About what a JAX worker takes before its state: a smaller rss limit cannot work."""


def job_warnings(job: Job) -> list[str]:
    """Settings that validate but cannot work as meant, each naming the field to change."""
    sup, warnings = job.supervision, []
    stall, delay = sup.stall_timeout_s, job.faults.step_delay_s
    if stall is not None and delay >= stall:
        warnings.append(
            f"supervision.stall_timeout_s = {stall:g} is not longer than faults.step_delay_s"
            f" = {delay:g}: every update would be taken for a stall"
        )
    if sup.startup_timeout_s < 10:
        warnings.append(
            f"supervision.startup_timeout_s = {sup.startup_timeout_s:g}: a JAX worker takes"
            " seconds to import and compile on a busy machine; healthy starts may be stalls"
        )
    if sup.max_rss_mb is not None and sup.max_rss_mb < JAX_WORKER_MB:
        warnings.append(
            f"supervision.max_rss_mb = {sup.max_rss_mb}: a JAX worker alone takes about"
            f" {JAX_WORKER_MB} MB; every attempt would be stopped"
        )
    return warnings
