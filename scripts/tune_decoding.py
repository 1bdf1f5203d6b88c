"""Choose beam size and length penalty on the validation split, then score the choice once on test.

    python scripts/tune_decoding.py outputs/RUN --test-split test_2016_flickr   # into outputs/RUN/decoding_grid.*

Logic and options: nmt/analysis/decoding.py (`--help`).
"""

from nmt.analysis.decoding import main

if __name__ == "__main__":
    main()
