"""Notify: what gpufinops tells whom (model.Notice), routed and delivered.

- `messages`: the notices of the act and run stages (pure: instances and decisions -> Notice; no transport).
- `routing`: an audience and a notice's `to` (a rule's `notify_to`: `slack:#c`, `email:a@b`, `owner`, `team`,
  `default`) turned into destinations, and `Deliveries`, the one Notifier every stage sends through
  (team/rule/default channel; the owner by Slack DM, or by email when the owner tag is an address and Slack
  cannot reach them; finance by email). Stages send an audience, never a channel name.
- `chat`: `ChatDelivery`, what a chat transport offers beyond send/retry (the in-place edit, the user lookup);
  only `Deliveries` calls it, so nothing outside notify/ knows which chat it is.
- deliveries, each exactly once per idempotency key in the notifications table: `delivery` (Slack: retries on
  429, lookup after a lost answer; the outbox without a token), `slack_blocks` (a Notice as Block Kit, the
  in-place edit after a snooze), `email` (SMTP: text + HTML parts, STARTTLS/SSL, auth; at most once when the
  server's answer is lost). `markup`: the Notice's small text markup every delivery reads. `interact`: the
  Slack buttons (signed actions, who may click, the snooze they ask for); `socket_mode`: the same clicks over
  Slack Socket Mode (no public URL), fed to the same `interact.handle_verified`.

Email for other stages (the monthly report to finance): build a Notice (key = one per report and period,
audience ("finance",)) and call `EmailDelivery(settings.email, store, clock).send(notice, to=settings.email.finance,
attachments=[(filename, mime_type, data)])`; it returns True once the server accepted it (also on a repeat
call after that), and records the try in the notifications table. A notice sent with attachments that was not
accepted is never sent again by the service's `retry_due` (it has only the text): the caller sends it again.

A third transport (a Teams webhook): one module here implementing `chat.ChatDelivery` (`send(notice) -> bool`,
`retry_due(now)` over the same notifications table; `update` and `user_id_for_email` where Teams can, else
False/None), its settings section in config/sections.py, a line in run/compose.live_notifier, and in routing.Deliveries
its transport name in `destinations` (`teams:<channel>`, accepted by config.destination's TRANSPORTS); its
buttons: interact.py and a route in run/service.py. Nothing in model.py, rules.py, act/, decide/, cost/ or run/'s
jobs: they name audiences and destinations, not a transport.

May import: model, config, store, words, k8s.model, places.registry (nouns and verbs per place), places.gcp.labels
(the labels a person sets on a GCE VM, in a warning's way out),
places.kubernetes.cloud (a workload id's prefix and length).
Never imports act, run, cost, report, recommend, backtest, demo, agent or cli.
"""
