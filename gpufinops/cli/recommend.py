"""`gpufinops recommend` (right-size + purchase mix for the running fleet) and `gpufinops size`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import uuid
from datetime import datetime, timezone



# No model is near a quadrillion parameters: a bigger --params is a typo, and inf would overflow the estimate.
MAX_PARAMS = 1e15


def _parse_params(text: str) -> float:
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if t[-1:] and t[-1:] in "KMBT" else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"--params: {text!r} is not a number (e.g. 70e9 or 70B)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--params must be a positive number, got {text!r}")
    if value > MAX_PARAMS:
        raise argparse.ArgumentTypeError(f"--params {text!r} is more than {MAX_PARAMS:.0e} parameters")
    return value


def refresh_gcp_prices(settings, catalog, now: datetime) -> None:
    """The GCP GPU VM prices read from the Cloud Billing Catalog and kept in gcp.price_cache_path (asked for by
    --refresh-prices); a failure is said and the earlier prices stay."""
    from ..places.gcp.billing_catalog import catalog_fetcher
    from ..prices.gcp_refresh import refresh_from_gcp, save_gcp_refresh

    try:
        cache = refresh_from_gcp(catalog_fetcher(settings.gcp), catalog, now)
    except Exception as exc:  # noqa: BLE001 - the bundled (or earlier refreshed) prices stay
        print(f"warning: GCP price refresh failed, earlier prices kept: {exc}", file=sys.stderr)
        return
    save_gcp_refresh(cache, settings.gcp.price_cache_path)
    parts = sum(":" in key for key in cache.prices)  # "machine:<type>@<region>", "gpu:<name>@<region>"
    print(f"GCP prices: {len(cache.prices) - parts} machine type(s) and {parts} N1 part(s) (machine type or "
          f"attached GPU, per region) refreshed from the Cloud Billing Catalog"
          + (f", {len(cache.kept)} kept at their bundled price" if cache.kept else ""), file=sys.stderr)


def _load_catalog(policy, now: datetime, settings=None, refresh: bool = False):
    from ..prices.catalog import load_catalog, load_refresh, refresh_from_aws, save_refresh

    catalog = load_catalog(policy.catalog_dir)
    gcp = getattr(settings, "gcp", None)
    if refresh and gcp is not None:
        refresh_gcp_prices(settings, catalog, now)
    if refresh and settings is not None and (gcp is None or "aws" in settings.model_fields_set):
        import boto3

        from ..collect.aws_config import read_config

        session = boto3.session.Session(profile_name=settings.aws.profile)
        region = settings.aws.regions[0]
        ec2 = session.client("ec2", region_name=region, endpoint_url=settings.aws.endpoint_url, config=read_config())
        pricing = session.client("pricing", region_name="us-east-1", endpoint_url=settings.aws.endpoint_url,
                                 config=read_config())
        types = sorted({o.instance_type for o in catalog.offers if o.provider == "aws"})
        from ..collect.errors import answer_excerpt

        cache = refresh_from_aws(ec2, pricing, region, types, now)
        save_refresh(cache, policy.price_cache_path)
        for err in cache.errors:  # an API's error may quote its HTML error page: one short line each
            print(f"warning: price refresh: {answer_excerpt(err)}", file=sys.stderr)
    cache = load_refresh(policy.price_cache_path)
    if cache is not None:
        catalog = catalog.with_aws_refresh(cache)
    if gcp is not None:
        from ..prices.gcp_refresh import load_gcp_refresh, with_gcp_refresh

        gcp_cache = load_gcp_refresh(gcp.price_cache_path)
        catalog = with_gcp_refresh(catalog, gcp_cache) if gcp_cache is not None else catalog
    if catalog.skipped:
        print(f"note: {len(catalog.skipped)} catalog row(s) skipped, first: {catalog.skipped[0]}", file=sys.stderr)
    return catalog


def _rules_or_none(settings):
    """The service's rules, so stop advice respects their exclusions; None (not checked) when they cannot be read,
    with one warning."""
    from ..config import ConfigError
    from ..rules import load_rules

    try:
        return load_rules(settings.rules_paths)
    except (ConfigError, OSError) as exc:
        print(f"warning: rules not read, stop advice does not check their exclusions: {exc}", file=sys.stderr)
        return None


def cmd_recommend(args: argparse.Namespace) -> int:
    from .common import EXIT_PROBLEM_FOUND, load_settings_from_args
    from ..prices.catalog import CatalogError
    from ..places.ec2.cloud import InventoryError
    from ..run.compose import live_cloud, live_store, live_usage
    from ..recommend.engine import recommend_fleet, stale_prices_warning, store_recommendations
    from ..recommend.policy import policy_from_settings
    from ..recommend.table import render

    settings = load_settings_from_args(args)
    policy = policy_from_settings(settings)
    now = datetime.now(timezone.utc)  # the edge: logic below takes `now` as a value
    try:
        catalog = _load_catalog(policy, now, settings, refresh=args.refresh_prices)
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - an asked-for refresh that failed: the bundled prices, said in one line
        from ..collect.errors import answer_excerpt

        print(f"warning: price refresh failed, using the bundled prices: {answer_excerpt(exc)}", file=sys.stderr)
        catalog = _load_catalog(policy, now)
    cloud = live_cloud(settings, with_prices=False)
    try:
        instances = cloud.list_gpu_instances()
    except InventoryError as exc:  # every region failed: nothing to recommend on, and the source is named
        print(f"error: inventory: {exc}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND
    # No call to the AWS Pricing API unless --refresh-prices asks for it (a least-privilege or air-gapped install
    # did not): prices too old are said in one line below, with how to refresh them.
    errors = [f"inventory: {err}" for err in getattr(cloud, "last_errors", [])]
    interval = policy.scrape_interval_s or settings.prometheus.scrape_interval_s
    usage = live_usage(settings).fleet_usage(
        instances, policy.window_days * 86400, now, interval, policy.commitment.window_days * 86400)
    # A failed query gives every instance the same error (and no recommendation on usage it never saw).
    errors += [f"prometheus: {e}" for e in sorted({u.error for u in usage.instances.values() if u.error})]
    recs = recommend_fleet(instances, usage, catalog, policy, now, rules=_rules_or_none(settings),
                           opt_in=(settings.act.opt_in_tag, settings.act.opt_in_value))
    warning = stale_prices_warning(recs, now, policy)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)  # once for the run, not once per row
    if not args.no_store:
        store = live_store(settings)
        try:
            store_recommendations(store, uuid.uuid4().hex[:12], recs)
        finally:
            store.close()
    print(render(recs, args.output))
    # JSON and CSV stay the recommendation rows; a failed source is said on stderr and in the exit code.
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_PROBLEM_FOUND if errors else 0


def cmd_size(args: argparse.Namespace) -> int:
    from .common import load_settings_from_args
    from ..prices.catalog import CatalogError
    from ..recommend.policy import policy_from_settings
    from ..recommend.sizing import SizingError, estimate_memory, fitting_options

    policy = policy_from_settings(load_settings_from_args(args, uses_database=False))
    try:
        est = estimate_memory(args.params, args.mode, args.precision, args.context, args.batch,
                              args.layers, args.hidden)
    except SizingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        catalog = _load_catalog(policy, datetime.now(timezone.utc))
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = fitting_options(est, catalog, args.provider or None, args.limit)
    if args.output == "json":
        print(json.dumps({"estimate": est.to_dict(), "options": [o.to_dict() for o in options]}, indent=2))
        return 0
    if args.output == "csv":  # one row per fitting configuration, the estimate's total beside each
        import csv

        rows = [{"total_gb": round(est.total_gb, 3), **o.to_dict()} for o in options]
        flat = [{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()} for r in rows]
        fields = list(flat[0]) if flat else ["total_gb"]
        writer = csv.DictWriter(sys.stdout, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(flat)
        return 0 if options else 1
    d = est.to_dict()
    print(f"{args.params:.3g} params, {est.mode.value}, {est.precision}, context {est.context}, batch {est.batch} "
          f"(assumed shape: {est.layers} layers, hidden {est.hidden})")
    for k in ("weights_gb", "gradients_gb", "optimizer_gb", "activations_gb", "kv_cache_gb", "overhead_gb"):
        if k in d:
            print(f"  {k[:-3]:<12} {d[k]:>10,.1f} GB")
    print(f"  {'total':<12} {est.total_gb:>10,.1f} GB  (weights+grads+optimizer {est.states_gb:,.1f} GB)")
    if not options:
        print("no catalog configuration holds this workload")
        return 1
    from .common import render_table

    print("\ncheapest fitting configurations (on-demand):")
    print(render_table([{"provider": o.offer.provider, "instance_type": o.offer.instance_type,
                         "gpus": f"{o.offer.gpu_count}x {o.offer.gpu}", "region": o.offer.region,
                         "usd_per_hour": f"{o.offer.on_demand_usd_h:,.2f}", "note": o.note,
                         "prices_as_of": o.offer.prices_as_of} for o in options],
                       right=("usd_per_hour",)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from .common import add_output_option, int_in

    p = sub.add_parser("recommend", help="right-size GPU instances and recommend spot/on-demand/commitment, with savings")
    add_output_option(p)
    p.add_argument("--no-store", action="store_true", help="do not store the results in the database")
    p.add_argument("--refresh-prices", action="store_true",
                   help="refresh AWS GPU facts and prices from the EC2/Pricing APIs before recommending (never done "
                        "unless asked: without it the bundled or last refreshed prices are used and their age said)")
    p.set_defaults(func=cmd_recommend)

    s = sub.add_parser("size", help="estimate the memory of a declared workload and the cheapest GPUs that hold it")
    s.add_argument("--params", type=_parse_params, required=True, help="parameter count, e.g. 70e9 or 70B")
    s.add_argument("--mode", choices=("inference", "peft", "full-finetune", "pretrain"), required=True)
    s.add_argument("--precision", choices=("fp32", "bf16", "fp16", "fp8", "int8", "int4"), default="bf16")
    # Bounds far beyond any real model: they only refuse nonsense (a negative count, a typo of 1e20).
    s.add_argument("--context", type=int_in(1, 10**9), default=4096, help="sequence length in tokens (default 4096)")
    s.add_argument("--batch", type=int_in(1, 10**7), default=1,
                   help="sequences per step / concurrent requests (default 1)")
    s.add_argument("--layers", type=int_in(1, 10**5), default=None,
                   help="model layers (default: estimated from --params)")
    s.add_argument("--hidden", type=int_in(1, 10**7), default=None,
                   help="hidden size (default: estimated from --params)")
    s.add_argument("--provider", action="append", help="limit to a provider (repeatable): aws gcp azure lambda runpod")
    s.add_argument("--limit", type=int_in(1, 10**4), default=10,
                   help="at most this many configurations (default 10)")
    add_output_option(s)
    s.set_defaults(func=cmd_size)
