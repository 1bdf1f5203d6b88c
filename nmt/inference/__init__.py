"""The engine (``Translator``) and the jobs on top of it: files, words and alignments, plots, back-translation."""
