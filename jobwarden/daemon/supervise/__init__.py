"""One supervisor per live job: its attempts, the policy, stalls, diagnosis and outcomes."""
