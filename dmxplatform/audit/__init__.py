"""The audit log, on django-auditlog: who changed what and when, with before and after.

Which models and fields are kept is settings (dmxplatform/settings/audit.py): auditlog's model
signals record every save and delete, its middleware names the signed-in user as the actor.
entries.py covers what those cannot see; admin.py is the console's read-only view of the log.
"""
