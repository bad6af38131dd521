-- A user's job names are the user's own: without this the planner takes (user_name, name)
-- to be independent, expects a handful of rows per pair, and reads every past success of
-- a much-repeated name instead of the latest few through jobs_history.
CREATE STATISTICS jobs_user_name ON user_name, name FROM jobs;
