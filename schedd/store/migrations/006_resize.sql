-- Elastic jobs: the GPU count a job is to restart with once its checkpoint is saved.
ALTER TABLE jobs ADD COLUMN resize_to integer CHECK (resize_to > 0);
