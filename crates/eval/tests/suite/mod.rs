mod attempts;
mod redteam;
mod support;
