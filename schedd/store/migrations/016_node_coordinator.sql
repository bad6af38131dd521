-- Whether the node's agent runs its coordinator (its hello's `Inventory.coordinator`):
-- where not, no opportunistic job is placed there. As of the agent's last connect.
ALTER TABLE nodes ADD COLUMN coordinator boolean NOT NULL DEFAULT true;
