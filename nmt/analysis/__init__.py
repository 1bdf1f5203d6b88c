"""What users run on their own runs, behind ``scripts/``: run comparison, decoding tuning and their measures."""
