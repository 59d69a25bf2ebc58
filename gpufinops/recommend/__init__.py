"""Recommend: right-sized GPU models and counts, and the on-demand / spot / committed mix, with dollar savings.

Reads days of fleet usage through `usage.PrometheusUsage` (collect's PromReader underneath) and the price catalog;
returns recommendations as values (`engine.recommend_fleet`), stored and posted by the caller. Never changes a
cloud resource. May import: model, config, words (the one text table), catalog, prices, collect.
"""
