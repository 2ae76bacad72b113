//! Bundling a workspace's programs and deploying them to a GPU host over ssh and rsync.

pub mod bundle;
pub mod cmd;
pub mod deploy;
pub mod install_nvcc;
pub mod interrupt;
pub mod lock;
pub mod programs;
