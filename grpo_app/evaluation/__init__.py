"""Scoring trained models honestly: greedy decoding on held-out problems with intervals and paired tests
(`scoring`), the stage × task matrix of a curriculum (`stage_matrix`), and asking two models the same
question (`ask`, the Try tab).
"""
