-- Deadlines (Chronus): the job's deadline, and whether the policy guaranteed it
-- (NULL: not decided yet, or the policy does not decide deadlines) and why.
ALTER TABLE jobs ADD COLUMN deadline timestamptz;
ALTER TABLE jobs ADD COLUMN deadline_admitted boolean;
ALTER TABLE jobs ADD COLUMN deadline_reason text;
UPDATE jobs SET deadline = (spec->>'deadline')::timestamptz WHERE spec->>'deadline' IS NOT NULL;
