-- Drained nodes: an admin took the node out of placement (`POST /v1/nodes/{node}/drain`)
-- until it is put back (`DELETE` on the same path): why, who, and when. Jobs placed
-- there run on (or were requeued, if the admin asked); nothing new starts there. Kept
-- across agent reconnects and schedd restarts.
ALTER TABLE nodes ADD COLUMN drain_reason text;
ALTER TABLE nodes ADD COLUMN drained_by text;
ALTER TABLE nodes ADD COLUMN drained_at timestamptz;
