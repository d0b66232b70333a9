"""What the daemon keeps on disk: the root's layout, job records, evidence, the archive, its log."""
