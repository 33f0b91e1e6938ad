"""The registry of audit action names. ``audit.record`` refuses a name that is not here, so the
vocabulary stays small, greppable and documented."""

ACTIONS: dict[str, str] = {
    # identity and tenancy
    "org.create": "An organisation was created",
    "org.update": "Organisation settings changed",
    "user.create": "A user was created in an organisation",
    "invitation.create": "An email address was invited into an organisation",
    "invitation.revoke": "An invitation was revoked",
    "invitation.accept": "An invitation was accepted: the account joined the organisation",
    "org_member.update": "An organisation role changed",
    "token.create": "An API token was issued",
    "token.revoke": "An API token was revoked",
    "workspace.create": "A workspace was created",
    "workspace.update": "Workspace settings changed",
    "workspace.archive": "A workspace was archived",
    "member.add": "A workspace role was granted",
    "member.update": "A workspace role changed",
    "member.remove": "A workspace role was revoked",
    # jobs
    "template.create": "A job template was created",
    "template.update": "A job template got a new version",
    "template.archive": "A job template was archived",
    "job.submit": "A job was submitted",
    "job.approve": "A job was approved",
    "job.reject": "A job was rejected",
    "job.cancel": "A job was cancelled",
    "job.transition": "A job changed state",
    "job.preempting": "A running job was chosen for preemption; its grace period started",
    "package.upload": "A code package was uploaded to a workspace (or fetched from a source)",
    "code_source.create": "A git code source was registered in a workspace",
    "code_source.update": "A code source changed",
    "code_source.delete": "A code source was removed",
    "job.node_restarted": "A dead worker node of a job's cluster was started again",
    "compute_target.create": "A compute target was created",
    "compute_target.update": "A compute target changed",
    "compute_target.delete": "A compute target was deleted",
    "warm_pool.create": "A warm pool was created for a local compute target",
    "warm_pool.update": "A warm pool was resized or its idle timeout changed",
    # quotas
    "quota.update": "Capacity or a workspace quota changed",
    "quota_group.create": "A quota group was added to the organisation's quota tree",
    "quota_group.update": "A quota group changed (its quota, name or parent)",
    "quota_group.delete": "A quota group was removed from the quota tree",
    # webhooks and notifications
    "webhook.create": "A webhook endpoint was created",
    "webhook.update": "A webhook endpoint changed",
    "webhook.delete": "A webhook endpoint was deleted",
    "webhook.rotate_secret": "A webhook endpoint's signing secret was rotated",
    "webhook.ping": "A test message was sent to a webhook endpoint",
    "webhook.redeliver": "A webhook delivery was sent again on request",
    "webhook.disable": "A failing webhook endpoint was disabled by the system",
    "user.notification_preferences": "A user changed which emails they receive",
}


def is_registered(action: str) -> bool:
    return action in ACTIONS
