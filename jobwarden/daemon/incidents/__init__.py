"""Incidents: records, runbooks, goodput."""
