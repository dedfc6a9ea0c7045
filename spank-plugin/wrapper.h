/* The Slurm headers the plugin is built against: the SPANK API and the
 * version of the Slurm that installed them (plugin_version comes from it). */
#include <slurm/spank.h>
#include <slurm/slurm_version.h>
