/* SPDX-License-Identifier: MIT */
/* dlist: intrusive doubly linked lists, for any struct with next and prev
 * pointers, kept by a head pointer (a queue: head and tail).  Arguments are
 * evaluated more than once: pass plain lvalues. */
#pragma once

#define DLIST_PUSH(head, e)                                                     \
        do {                                                                    \
                (e)->prev = NULL;                                               \
                (e)->next = (head);                                             \
                if (head)                                                       \
                        (head)->prev = (e);                                     \
                (head) = (e);                                                   \
        } while (0)

/* e leaves the list; its own next and prev are left as they were. */
#define DLIST_UNLINK(head, e)                                                   \
        do {                                                                    \
                if ((e)->prev)                                                  \
                        (e)->prev->next = (e)->next;                            \
                else                                                            \
                        (head) = (e)->next;                                     \
                if ((e)->next)                                                  \
                        (e)->next->prev = (e)->prev;                            \
        } while (0)

/* The same for a queue: tail follows. */
#define DQUEUE_PUSH_HEAD(head, tail, e)                                         \
        do {                                                                    \
                if (!(head))                                                    \
                        (tail) = (e);                                           \
                DLIST_PUSH(head, e);                                            \
        } while (0)

#define DQUEUE_PUSH_TAIL(head, tail, e)                                         \
        do {                                                                    \
                (e)->next = NULL;                                               \
                (e)->prev = (tail);                                             \
                if (tail)                                                       \
                        (tail)->next = (e);                                     \
                else                                                            \
                        (head) = (e);                                           \
                (tail) = (e);                                                   \
        } while (0)

#define DQUEUE_UNLINK(head, tail, e)                                            \
        do {                                                                    \
                if (!(e)->next)                                                 \
                        (tail) = (e)->prev;                                     \
                DLIST_UNLINK(head, e);                                          \
        } while (0)
