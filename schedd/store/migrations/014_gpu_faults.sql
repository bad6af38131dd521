-- GPU faults: a GPU whose XID error points at the hardware (not in schedd's
-- `gpu_fault_ignore_xids`) is out of placement from its first such error until an
-- admin clears it (`DELETE /v1/nodes/{node}/gpus/{uuid}/fault`): what it said, its XID
-- (NULL: the GPU was lost) and when. Kept across agent reconnects and schedd restarts.
ALTER TABLE gpus ADD COLUMN fault text;
ALTER TABLE gpus ADD COLUMN fault_xid integer;
ALTER TABLE gpus ADD COLUMN fault_at timestamptz;
