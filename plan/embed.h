/* plan_embed.h - how a compiled executable carries its plan: the runner binary, then the plan
 * (the step graph in the IR's text form), then a trailer of the plan's length (8 bytes, little
 * endian) and the magic "PTCPLAN1". ptc writes it; the runner reads its own file back.
 */
#ifndef PTRT_PLAN_EMBED_H
#define PTRT_PLAN_EMBED_H

#include <stddef.h>

#define PTRT_PLAN_MAGIC "PTCPLAN1"

/* Writes runner (the runner executable's path) + plan + trailer to out, atomically, mode 0755.
 * Returns 0, or -1 with a message naming the file. */
int ptrt_plan_write_exe(const char *runner, const char *plan, size_t planlen, const char *out,
                        char *err, size_t errn);
/* Reads the plan embedded at the end of the file path (malloc'd, NUL-terminated), or NULL with a
 * message. */
char *ptrt_plan_read_exe(const char *path, char *err, size_t errn);

#endif
