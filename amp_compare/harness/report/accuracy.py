"""The Accuracy section's words: how the paired comparisons were made, naming only the tests this run ran."""

from __future__ import annotations

import pandas as pd

from amp_compare.harness.report import stats

HOW = {  # how each of stats' methods makes a paired comparison, and what its interval is
    stats.MCNEMAR: "McNemar's exact test where there is one seed (its interval: Newcombe's score interval for a "
                   "paired difference, which lets the number of images that differ vary)",
    stats.BOOTSTRAP: "a paired bootstrap over images (the same images resampled for every seed) where there are "
                     "several (its interval: the bootstrap's 95% percentile interval)",
    stats.NO_DIFFERENCE: "no test where every image was classified right or wrong exactly as in fp32: the interval "
                         "is then the exact 95% bound on the share of images that could differ",
}


def section_paragraph(acc: pd.DataFrame) -> str:
    """The paragraph above the accuracy table."""
    how = [text for method, text in HOW.items() if method in set(acc.get("method", pd.Series(dtype=str)).dropna())]
    return ("Accuracy differences are paired: cells of one model, dataset and seed start from the same weights and "
            "are scored on the same validation images, so each mixed cell is compared image by image with its fp32"
            + (": " + "; ".join(how) if how else "") + ". A difference counts as detectable only when p (the "
            "probability of a difference at least this large if precision changed nothing) is below "
            f"{stats.ALPHA} and its 95% interval excludes zero. \"Not comparable\" means fp32 itself was near chance "
            "or still improving steeply at the last epoch, so the run is too short to say anything about accuracy. "
            "Time to target is the training time (validation excluded) until the validation accuracy, checked after "
            "every epoch, first reached the target.")
